package arborui

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// The limits: the concurrency limits, each with the runs holding a slot
// of it, and the tenants' weights in the fair claim (docs/design.md
// §3.15). Read-only: the arbor command (limits, tenants) and the
// Engine set them. Both tables are small (an operator's settings), and
// are read whole.

type limitsView struct {
	page
	Limits  []arbortype.ConcurrencyLimit
	Tenants []arbortype.Tenant
	Now     time.Time
	Stream  string
}

func (h *handler) limitsView(ctx context.Context) (limitsView, error) {
	v := limitsView{page: h.page("limits", nil).in("limits"), Now: time.Now(), Stream: link(h.opts.Prefix, "/limits/live")}
	var err error
	if v.Limits, err = h.engine.ConcurrencyLimits(ctx); err != nil {
		return v, err
	}
	if v.Tenants, err = h.engine.Tenants(ctx); err != nil {
		return v, err
	}
	return v, nil
}

func (h *handler) limits(w http.ResponseWriter, r *http.Request) {
	v, err := h.limitsView(r.Context())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "limits.html", v.page.with(v))
}

// limitsLive streams the limits page, again at every refresh: a limit's
// running count moves with every start and end of a run of its key,
// which the log does not say across conversations.
func (h *handler) limitsLive(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, stream{render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		v, err := h.limitsView(ctx)
		if err != nil {
			return "", false, err
		}
		return "fragment", false, h.tmpl.ExecuteTemplate(buf, "limitTables", v)
	}})
}
