package arborui

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/arborhq/arbor/internal/inspect"
)

// The stats page: the turns (root tasks) started, settled and failed per
// minute over the last hour, and each tenant's pending depth and oldest
// pending, over all tenants or one. Every read is bounded (statsScan rows
// of each index it reads; see inspect.TurnStats), so the page costs the
// same over 100,000 conversations as over ten, and says when a bound cut
// a count. Live: read again every statsEvery refreshes (the reads are a
// page's, not one probe's).

const (
	// statsWindow is the time the page covers.
	statsWindow = time.Hour
	// statsScan bounds each read of the page's.
	statsScan = 100_000
	// statsDepth bounds each tenant's pending count.
	statsDepth = 10_000
	// statsTenants is the most tenants the page lists.
	statsTenants = 100
	// statsEvery is how many refreshes (Options.Refresh) the page's stream
	// waits between two reads.
	statsEvery = 10
)

type statsView struct {
	page
	S inspect.TurnStats
	// Tenant is the tenant the chart shows ("": every tenant's).
	Tenant string
	// Minutes are the window's minutes, the oldest first, with the chart's
	// geometry; Top the chart's scale.
	Minutes []minuteBar
	Top     int
	// Tenants are the per-tenant rows; Total all of them.
	Tenants []tenantStats
	Total   tenantStats
	Stream  string
}

// minuteBar is one minute of the chart: its counts, and its bars' x and
// heights in the SVG's units (a 600 × 100 box: 10 per minute).
type minuteBar struct {
	At                          time.Time
	Started, Settled, Failed    int
	X                           int
	HStarted, HSettled, HFailed int
}

type tenantStats struct {
	Tenant                   string
	Started, Settled, Failed int
	Pending                  int
	PendingCapped            bool
	// Oldest is the age of the head of its queue (0: nothing pending).
	Oldest time.Duration
}

func (h *handler) statsView(ctx context.Context, tenant string) (statsView, error) {
	s, err := h.reader.TurnStats(ctx, statsWindow, statsScan, statsDepth, statsTenants)
	if err != nil {
		return statsView{}, err
	}
	v := statsView{page: h.page("stats", nil).in("stats"), S: s, Tenant: tenant, Stream: link(h.opts.Prefix, "/stats/live", "tenant", tenant)}
	by := map[string]*tenantStats{}
	row := func(t string) *tenantStats {
		if by[t] == nil {
			by[t] = &tenantStats{Tenant: t}
		}
		return by[t]
	}
	last := s.Now.Truncate(time.Minute)
	first := last.Add(-statsWindow + time.Minute)
	v.Minutes = make([]minuteBar, int(statsWindow/time.Minute))
	for i := range v.Minutes {
		v.Minutes[i].At = first.Add(time.Duration(i) * time.Minute)
		v.Minutes[i].X = i * 10
	}
	for _, m := range s.Minutes {
		r := row(m.Tenant)
		r.Started += m.Started
		r.Settled += m.Settled
		r.Failed += m.Failed
		if tenant != "" && m.Tenant != tenant {
			continue
		}
		i := int(m.Minute.Sub(first) / time.Minute)
		if i < 0 || i >= len(v.Minutes) {
			continue
		}
		v.Minutes[i].Started += m.Started
		v.Minutes[i].Settled += m.Settled
		v.Minutes[i].Failed += m.Failed
	}
	for _, p := range s.Pending {
		r := row(p.Tenant)
		r.Pending, r.PendingCapped = p.N, p.Capped
		if !p.Oldest.IsZero() {
			r.Oldest = s.Now.Sub(p.Oldest)
		}
	}
	for _, r := range by {
		v.Tenants = append(v.Tenants, *r)
		v.Total.Started += r.Started
		v.Total.Settled += r.Settled
		v.Total.Failed += r.Failed
		v.Total.Pending += r.Pending
		v.Total.PendingCapped = v.Total.PendingCapped || r.PendingCapped
		v.Total.Oldest = max(v.Total.Oldest, r.Oldest)
	}
	slices.SortFunc(v.Tenants, func(a, b tenantStats) int {
		switch {
		case a.Tenant < b.Tenant:
			return -1
		case a.Tenant > b.Tenant:
			return 1
		}
		return 0
	})
	v.Top = 1
	for _, m := range v.Minutes {
		v.Top = max(v.Top, m.Started, m.Settled)
	}
	for i := range v.Minutes {
		m := &v.Minutes[i]
		m.HStarted, m.HSettled, m.HFailed = m.Started*95/v.Top, m.Settled*95/v.Top, m.Failed*95/v.Top
	}
	return v, nil
}

func (h *handler) stats(w http.ResponseWriter, r *http.Request) {
	v, err := h.statsView(r.Context(), r.URL.Query().Get("tenant"))
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "stats.html", v.page.with(v))
}

// statsLive streams the stats page's figures, read again every
// statsEvery refreshes.
func (h *handler) statsLive(w http.ResponseWriter, r *http.Request) {
	tenant := r.URL.Query().Get("tenant")
	n := 0
	h.serve(w, r, stream{
		poll: func(context.Context) (bool, error) {
			n++
			return n%statsEvery == 0, nil
		},
		render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
			v, err := h.statsView(ctx, tenant)
			if err != nil {
				return "", false, err
			}
			return "fragment", false, h.tmpl.ExecuteTemplate(buf, "stats", v)
		},
	})
}
