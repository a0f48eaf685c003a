package machine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// adopt starts the runs that a transaction whose commit's answer was lost
// claimed: running tasks of the conversations (nil: every one the node's
// life holds, its leases read back too) under this node's current epoch
// that no handler here runs. It write-holds claimMu, so no claim of the
// runner's own is between its commit and its dispatch meanwhile. A read
// that fails sets unresolved, so the maintenance loop adopts again.
func (r *Runner) adopt(ctx context.Context, convs map[string]bool) {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	if convs == nil {
		holderID, _ := r.lease.holder()
		leases, err := core.Read(ctx, r.core, func(db store.DB) ([]core.Lease, error) {
			return r.core.HeldBy(ctx, db, r.cfg.NodeID, holderID)
		})
		if err != nil {
			r.logger.Warn("arbor: reading back this node's leases failed; those it took unawares are adopted once the database answers",
				slog.String("error", err.Error()))
			r.unresolved.Store(true)
			return
		}
		now := time.Now()
		convs = make(map[string]bool, len(leases))
		r.mu.Lock()
		for _, l := range leases {
			if _, lapsed := r.lapsed[l.ConversationID]; lapsed {
				continue // re-validated by a reopen
			}
			r.hold(l, now)
			convs[l.ConversationID] = true
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	ids := make([]string, 0, len(convs))
	for id := range convs {
		if h := r.held[id]; h != nil && !h.releasing {
			ids = append(ids, id)
		}
	}
	stopping := r.stopping
	r.mu.Unlock()
	if len(ids) == 0 || stopping {
		return
	}
	running, err := core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.RunningIn(ctx, db, ids) })
	if err != nil {
		r.logger.Warn("arbor: reading back the runs of a commit whose answer was lost failed; they are adopted once the database answers",
			slog.String("error", err.Error()))
		r.unresolved.Store(true)
		return
	}
	var orphans []arbortype.Task
	r.mu.Lock()
	for _, t := range running {
		if h := r.held[t.ConversationID]; h != nil && r.runs[t.ID] == nil && r.waiting[t.ID] == nil && t.Epoch == h.lease.Epoch {
			orphans = append(orphans, t)
		}
	}
	r.busy += len(orphans)
	r.mu.Unlock()
	if len(orphans) > 0 {
		r.logger.Info("arbor: adopted runs claimed by a commit whose answer was lost", slog.Int("runs", len(orphans)))
	}
	r.dispatch(orphans)
}

// markDirty says that the held conversations convs may have work (one
// released meanwhile is news for the producer to open); markHeld
// that any held one may; markOpen that an unheld one may; markNews that
// the unheld conv may.
func (r *Runner) markDirty(convs ...string) {
	p := r.prod
	r.mu.Lock()
	p.mu.Lock()
	for _, c := range convs {
		if r.held[c] != nil {
			p.dirty[c] = true
		} else {
			p.addNews(c) // released meanwhile: news of an unheld one
		}
	}
	p.mu.Unlock()
	r.mu.Unlock()
	p.poke()
}

func (r *Runner) markHeld() { r.prod.set(true, false, false) }

func (r *Runner) markOpen() { r.prod.set(false, true, false) }

// maxNews bounds the conversations the change channel named that wait to
// be looked at; past it, the producer scans for them instead.
const maxNews = 100_000

func (r *Runner) markNews(conv string) {
	p := r.prod
	p.mu.Lock()
	p.addNews(conv)
	p.mu.Unlock()
	p.poke()
}

// listenLoop hears the change channel: a held conversation's change may be
// new work, or a run stopped elsewhere (the watchdog checks its handlers);
// an unheld one's is work for the producer to open. What changed while it
// was not listening is found by polling at once.
//
// Behind a transaction-mode pooler with no ListenPool there is nothing to
// LISTEN on: the slow poll (PollInterval) finds the news instead.
func (r *Runner) listenLoop() {
	pool := r.core.Listener()
	if pool == nil {
		return
	}
	listen(r.runCtx, pool, r.core.Store.ChangeChannel(), r.logger,
		func() {
			r.markOpen()
			r.markHeld()
		},
		func(n *pgconn.Notification) {
			r.mu.Lock()
			_, held := r.held[n.Payload]
			r.mu.Unlock()
			if held {
				r.markDirty(n.Payload)
				r.watch.check(n.Payload)
			} else {
				r.markNews(n.Payload)
			}
		})
}
