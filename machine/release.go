package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/reconcile"
)

// releaseAll gives up, at shutdown, every conversation this life holds
// (held or lapsed) with no handler left running here: the idle ones in one
// statement, those with a task still running in the database (claimed and
// never started, or left by a handler cut off by a fault) one by one, each
// recovering its runs in its release's transaction (not counted: the
// holder stopped them), so that nothing the handler writes later lands. A
// conversation with a handler still running (one that ignored its
// cancelled context) is kept: it lapses with the node's lease.
func (r *Runner) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holderID, _ := r.lease.holder()
	r.mu.Lock()
	var idle, busy []core.Lease
	for id, h := range r.held {
		h.releasing = true
		if r.liveIn[id] == 0 {
			idle = append(idle, h.lease)
		}
	}
	for id, l := range r.lapsed {
		if r.liveIn[id] == 0 {
			busy = append(busy, l) // its runs were stopped by the fence: recovered by the release
		}
	}
	r.mu.Unlock()
	freed, err := core.Read(ctx, r.core, func(db store.DB) ([]string, error) {
		return r.core.ReleaseIdle(ctx, db, holderID, idle)
	})
	if err != nil {
		r.logger.Warn("arbor: releasing conversations at shutdown failed; they lapse with the node's lease", slog.String("error", err.Error()))
	}
	done := map[string]bool{}
	for _, id := range freed {
		done[id] = true
	}
	for _, l := range idle {
		if !done[l.ConversationID] && err == nil {
			busy = append(busy, l) // a run under it: the one-by-one path recovers it
		}
	}
	for _, l := range busy {
		rep, err := release(ctx, r.core, l, r.uncalled)
		switch {
		case errors.Is(err, arbortype.ErrLeaseLost):
		case err != nil:
			r.logger.Warn("arbor: releasing a conversation failed; it lapses with the node's lease", slog.String("conversation_id", l.ConversationID), slog.String("error", err.Error()))
		case !rep.Empty():
			r.logger.Info("arbor: released a conversation with tasks still running; they were recovered", slog.Any("report", rep))
		}
	}
	r.mu.Lock()
	for id := range r.held {
		if r.liveIn[id] == 0 {
			delete(r.held, id)
		}
	}
	for id := range r.lapsed {
		if r.liveIn[id] == 0 {
			delete(r.lapsed, id)
		}
	}
	r.mu.Unlock()
}

// release frees a lease, recovering the runs still under it (not counted
// as restarts: the holder gives them up; those uncalled reports requeued
// whatever their kind), in one transaction. A conversation another
// transaction holds is waited for.
func release(ctx context.Context, c *core.Engine, lease core.Lease, uncalled recovery.Uncalled) (reconcile.Report, error) {
	return releaseLocked(ctx, c, lease, uncalled, c.LockLease)
}

// releaseLocked is release with the conversation locked by lock (LockLease
// waits for it; the audit's TryLockLease does not).
func releaseLocked(ctx context.Context, c *core.Engine, lease core.Lease, uncalled recovery.Uncalled, lock func(context.Context, pgx.Tx, core.Lease) error) (reconcile.Report, error) {
	return core.Tx(ctx, c, func(tx pgx.Tx) (reconcile.Report, error) {
		if err := lock(ctx, tx, lease); err != nil {
			return reconcile.Report{}, fmt.Errorf("release conversation %q: %w", lease.ConversationID, err)
		}
		rep, err := recovery.RecoverRunning(ctx, c, tx, lease.ConversationID, false, uncalled)
		if err != nil {
			return rep, err
		}
		if _, err := c.ReleaseLease(ctx, tx, lease); err != nil {
			return rep, fmt.Errorf("release conversation %q: %w", lease.ConversationID, err)
		}
		return rep, nil
	})
}

// evictBatch bounds how many idle conversations one open releases to make
// room (in one statement).
const evictBatch = 1000

// releaseIdle releases the conversations with nothing running that have
// been idle past IdleRelease, in one statement, and forgets the unstarted
// runs of conversations long gone (forgetUnstarted).
func (r *Runner) releaseIdle(now time.Time) {
	r.mu.Lock()
	r.forgetUnstarted(now)
	var ls []core.Lease
	for id, h := range r.held {
		if r.liveIn[id] == 0 && !h.releasing && now.Sub(h.idleSince) >= r.cfg.IdleRelease {
			h.releasing = true
			ls = append(ls, h.lease)
		}
	}
	r.mu.Unlock()
	r.releaseLeases(ls)
}

// releaseForRoom releases up to n of the longest idle conversations and
// returns how many it released.
func (r *Runner) releaseForRoom(n int) int {
	r.mu.Lock()
	var idle []*heldConv
	for id, h := range r.held {
		if r.liveIn[id] == 0 && !h.releasing {
			idle = append(idle, h)
		}
	}
	slices.SortFunc(idle, func(a, b *heldConv) int { return a.idleSince.Compare(b.idleSince) })
	if len(idle) > n {
		idle = idle[:n]
	}
	ls := make([]core.Lease, len(idle))
	for i, h := range idle {
		h.releasing = true
		ls[i] = h.lease
	}
	r.mu.Unlock()
	return r.releaseLeases(ls)
}

// releaseLeases releases idle leases (marked releasing) in one statement
// and forgets those it released, which become news for the producer (work
// may have arrived as they went); one with a run claimed meanwhile stays
// held.
func (r *Runner) releaseLeases(ls []core.Lease) int {
	if len(ls) == 0 {
		return 0
	}
	holderID, _ := r.lease.holder()
	freed, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]string, error) {
		return r.core.ReleaseIdle(r.runCtx, db, holderID, ls)
	})
	if err != nil && r.runCtx.Err() == nil {
		r.logger.Warn("arbor: releasing idle conversations failed", slog.String("error", err.Error()))
	}
	done := make(map[string]bool, len(freed))
	for _, id := range freed {
		done[id] = true
	}
	recheck := false
	p := r.prod
	defer func() {
		if recheck {
			p.poke()
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range ls {
		if done[l.ConversationID] {
			if la, ok := r.lapsed[l.ConversationID]; ok && la.Epoch == l.Epoch {
				delete(r.lapsed, l.ConversationID) // released before the fence fired
			}
		}
		h := r.held[l.ConversationID]
		if h == nil || h.lease.Epoch != l.Epoch {
			continue
		}
		if done[l.ConversationID] {
			delete(r.held, l.ConversationID)
			// Work committed while it was being released may have been
			// announced as a held conversation's (dirty, and dropped with
			// it) or missed by the release's snapshot: the producer looks
			// at it again as an unheld one's news, and opens it if it has
			// work.
			delete(p.dirty, l.ConversationID)
			p.addNews(l.ConversationID)
			recheck = true
		} else {
			h.releasing = false
		}
	}
	return len(freed)
}
