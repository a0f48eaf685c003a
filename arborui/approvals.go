package arborui

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// The approvals: what every conversation awaits from outside — its tasks
// parked in an await — a page at a time, each with its context (the
// await's name, and the phase and state its handler saved with it: an
// await carries no payload of its own), answered from the page (with
// actions on): approve or deny, with a payload, through the await's own
// token (EmitToken), so that an answer to an await that is over is
// refused (409) and never kept for a later one. A task parked on a budget
// is no approval: it is shown as such, with the budgets that may have
// parked it and the action that raises one (budgetpark.go).

// contextShown is how much of an await's saved state the approvals show.
const contextShown = 1024

type approvalsView struct {
	page
	Awaits []inspect.AwaitListing
	// Contexts are the states the awaits' handlers saved, cut; Parks the
	// park budgets above each task parked on a budget.
	Contexts map[int64]inspect.AwaitContext
	Parks    map[int64][]arbortype.Budget
	// Back is the page's own address; Next and First the pager's; Stream
	// the live one.
	Back, Next, First, Stream string
	Now                       time.Time
}

func (h *handler) approvalsView(ctx context.Context, cursor string) (approvalsView, error) {
	p, err := h.reader.Awaits(ctx, inspect.AwaitQuery{Cursor: cursor, Limit: h.opts.RecentLimit})
	if err != nil {
		return approvalsView{}, err
	}
	v := approvalsView{page: h.page("approvals", nil).in("approvals"), Awaits: p.Awaits, Now: time.Now(),
		Back: link(h.opts.Prefix, "/approvals", "cursor", cursor), Stream: link(h.opts.Prefix, "/approvals/live", "cursor", cursor),
		Parks: map[int64][]arbortype.Budget{}}
	ids := make([]int64, len(p.Awaits))
	for i, a := range p.Awaits {
		ids[i] = a.ID
		if budgetPark(a) {
			if v.Parks[a.ID], err = h.parkedOn(ctx, a.Task); err != nil {
				return approvalsView{}, err
			}
		}
	}
	if len(ids) > 0 {
		if v.Contexts, err = h.reader.AwaitContexts(ctx, ids, contextShown); err != nil {
			return approvalsView{}, err
		}
	}
	if p.Next != "" {
		v.Next = link(h.opts.Prefix, "/approvals", "cursor", p.Next)
	}
	if cursor != "" {
		v.First = link(h.opts.Prefix, "/approvals")
	}
	return v, nil
}

func (h *handler) approvals(w http.ResponseWriter, r *http.Request) {
	v, err := h.approvalsView(r.Context(), r.URL.Query().Get("cursor"))
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "approvals.html", v.page.with(v))
}

// approvalsLive streams the page of approvals, again whenever anything
// was logged (an await parks, ends or is answered with a status entry).
func (h *handler) approvalsLive(w http.ResponseWriter, r *http.Request) {
	cursor := r.URL.Query().Get("cursor")
	h.serve(w, r, stream{poll: h.logMoved(15), render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		v, err := h.approvalsView(ctx, cursor)
		if err != nil {
			return "", false, err
		}
		return "fragment", false, h.tmpl.ExecuteTemplate(buf, "awaits", v)
	}})
}
