package arborui

import (
	"net/http"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// The schedules: each schedule's timing, what it starts, whether it is
// paused, its next tick and what its last firing did (docs/design.md
// §3.16). Read-only: schedules are made and changed through the API or
// arbor schedule.

type schedulesView struct {
	Schedules []arbortype.Schedule
	Now       time.Time
}

func (h *handler) schedules(w http.ResponseWriter, r *http.Request) {
	all, err := h.engine.Schedules(r.Context())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v := schedulesView{Schedules: all, Now: time.Now()}
	h.render(w, r, "schedules.html", h.page("schedules", v).in("schedules"))
}
