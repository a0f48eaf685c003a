package arborui

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/arborhq/arbor/internal/inspect"
)

// The nodes: who holds which conversations. A holder is a row of the
// holders table — a life of a runner's node (from its start, or from the
// new life it starts when its lease expired, to its stop), or one Lease
// — and holds every conversation that names it while its deadline has
// not passed. A node's earlier lives that are still on record are its
// give-ups (its lease lapsed: frozen, cut off, starved); an expired life
// that still names conversations has lapsed with them, and another node
// takes them over (a take-over recovers their running tasks, a restart
// of each: its attempt grows, and its log says running → pending).

const (
	// holdersShown is how many holder rows the page reads.
	holdersShown = 500
	// heldCounted is how many conversations of a holder are counted.
	heldCounted = 100_000
	// restartsScan is how many of the newest tasks are read for
	// restarts, and restartsShown how many are shown.
	restartsScan  = 10_000
	restartsShown = 20
)

// nodeRow is a holder name, with its lives.
type nodeRow struct {
	Name string
	// Current is its newest live life (its newest, when none is live);
	// Live counts its live lives (a runner has one; a caller's Leases may
	// be several under one name); Earlier are its lives whose deadline
	// passed, still on record: its give-ups.
	Current inspect.Holder
	Live    int
	Earlier []inspect.Holder
	// Held counts the conversations its live lives hold; Lapsed those
	// named by lives whose deadline passed (they wait for a take-over).
	Held, Lapsed int
	Capped       bool
	// Holding is the address of the list of its conversations.
	Holding string
}

type nodesView struct {
	page
	Nodes    []nodeRow
	Restarts []inspect.TaskSummary
	// Truncated says there are more holder rows than the page read.
	Truncated bool
	Now       time.Time
	Stream    string
}

func (h *handler) nodesView(ctx context.Context) (nodesView, error) {
	hs, err := h.reader.Holders(ctx, holdersShown, heldCounted)
	if err != nil {
		return nodesView{}, err
	}
	v := nodesView{page: h.page("nodes", nil).in("nodes"), Now: time.Now(), Truncated: len(hs) == holdersShown,
		Stream: link(h.opts.Prefix, "/nodes/live")}
	// By name, newest life first.
	for _, hd := range hs {
		if n := len(v.Nodes); n == 0 || v.Nodes[n-1].Name != hd.Name {
			v.Nodes = append(v.Nodes, nodeRow{Name: hd.Name, Current: hd,
				Holding: link(h.opts.Prefix, "/", "holder", hd.Name, "order", "id")})
			v.Now = hd.Now
		}
		n := &v.Nodes[len(v.Nodes)-1]
		n.Capped = n.Capped || hd.HeldCapped
		if hd.ExpiresAt.Before(hd.Now) {
			n.Earlier = append(n.Earlier, hd)
			n.Lapsed += hd.Held
			continue
		}
		if n.Live == 0 {
			n.Current = hd
		}
		n.Live++
		n.Held += hd.Held
	}
	if v.Restarts, err = h.reader.RecentRestarts(ctx, restartsScan, restartsShown); err != nil {
		return nodesView{}, err
	}
	return v, nil
}

func (h *handler) nodes(w http.ResponseWriter, r *http.Request) {
	v, err := h.nodesView(r.Context())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "nodes.html", v.page.with(v))
}

// nodesLive streams the nodes page, again at every refresh: the lease
// ages move by themselves.
func (h *handler) nodesLive(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, stream{render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		v, err := h.nodesView(ctx)
		if err != nil {
			return "", false, err
		}
		return "fragment", false, h.tmpl.ExecuteTemplate(buf, "nodeTable", v)
	}})
}
