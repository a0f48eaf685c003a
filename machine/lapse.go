package machine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/reconcile"
)

// errLeaseUnconfirmed is the cause of a handler context cancelled by the
// fence: the node could not confirm its lease in time (the database
// unreachable or slow, the process starved or frozen), so it stops acting
// as the holder before any other node may take its conversations.
var errLeaseUnconfirmed = fmt.Errorf("%w: the node could not confirm its lease in time", arbortype.ErrLeaseLost)

// errFencedClaim rolls back a claim's transaction (a claim in held
// conversations, an open, a reopen) when the fence fired while it ran: what
// it took could not be started, and would only be requeued by the next
// reopen. Checked after the claim's statement, before the commit, so a
// claim that waited behind a row lock while the fence fired (a flush of
// the conversation's ending, which made its next turn runnable) takes
// nothing. The fence can still fire between the check and the commit:
// what that claim took is then held lapsed, never entered, and requeued
// uncounted by the reopen (hold, start).
var errFencedClaim = errors.New("machine: the fence fired during the claim; rolled back")

// fencedClaim returns errFencedClaim when the node's lease is not usable
// now (the fence fired, or is due).
func (r *Runner) fencedClaim() error {
	if r.lease.usable(time.Now()) {
		return nil
	}
	return errFencedClaim
}

// fenceFired is the fence (nodeLease.fire): every handler's context is
// cancelled, every held conversation is marked lapsed — not claimed in,
// not released, nothing of it dispatched — until a renewal confirms the
// lease and a reopen re-validates it.
func (r *Runner) fenceFired() {
	r.mu.Lock()
	n := len(r.held)
	for id, h := range r.held {
		r.lapsed[id] = h.lease
		delete(r.held, id)
	}
	r.prod.mu.Lock()
	r.prod.dirty = map[string]bool{}
	r.prod.mu.Unlock()
	r.afterFlush = map[string]bool{}
	for _, a := range r.runs {
		a.stop(errLeaseUnconfirmed)
	}
	running := len(r.runs)
	r.mu.Unlock()
	r.logger.Warn("arbor: the node could not confirm its lease in time; its handlers are stopped before the lease can expire, and its conversations are re-validated once it is confirmed again",
		slog.Int("conversations", n), slog.Int("handlers", running))
}

// leaseConfirmed is called when a renewal confirms the lease after the
// fence fired. With the same life, the lapsed conversations are reopened;
// with a new life (the old row had expired), they are free in the database
// and are forgotten: the open path takes back those no other node took,
// its recovery of their runs not counted (they are this process's own).
func (r *Runner) leaseConfirmed(newLife bool) {
	p := r.prod
	r.mu.Lock()
	p.mu.Lock()
	if newLife {
		r.lapsed = map[string]core.Lease{}
		for id := range r.held {
			delete(r.held, id)
		}
		p.wantOpen = true
	} else {
		p.wantReopen = len(r.lapsed) > 0
		p.wantHeld = true
	}
	p.mu.Unlock()
	r.mu.Unlock()
	r.logger.Info("arbor: the node's lease is confirmed again", slog.Bool("new_life", newLife))
	p.poke()
}

// hold records a lease a transaction of this node took (under r.mu): held,
// or lapsed when the fence fired meanwhile (the conversation is then
// re-validated like the others). A lease of an earlier life of this node is
// forgotten: that life's row expired, so the conversation is free.
func (r *Runner) hold(l core.Lease, now time.Time) {
	if r.holdStarted(l, now) {
		r.prod.mu.Lock()
		r.prod.dirty[l.ConversationID] = true
		r.prod.mu.Unlock()
	}
}

// holdStarted is hold of a conversation a create took for the run it
// started: the conversation is new, so there is nothing else to claim in
// it. It says whether the lease was added (under r.mu).
func (r *Runner) holdStarted(l core.Lease, now time.Time) bool {
	if id, _ := r.lease.holder(); l.HolderID != id {
		return false
	}
	if r.lease.fired.Load() {
		r.lapsed[l.ConversationID] = l
		return false
	}
	if h := r.held[l.ConversationID]; h != nil && h.lease.Epoch == l.Epoch {
		return false
	}
	r.held[l.ConversationID] = &heldConv{lease: l, idleSince: now}
	return true
}

// reopenBatch bounds the conversations one reopen transaction takes.
const reopenBatch = 1000

// reopen re-validates lapsed conversations, a batch at a time, in one
// transaction each: those this life still holds at the epoch known (and no
// other transaction holds) are locked, their runs recovered — requeued, not
// counted as restarts: this node stopped them itself — and their runnable
// work claimed; they are held again. One taken over meanwhile is
// forgotten; one another transaction holds is tried again shortly.
func (r *Runner) reopen() {
	r.mu.Lock()
	var ls []core.Lease
	for _, l := range r.lapsed {
		ls = append(ls, l)
		if len(ls) == reopenBatch {
			break
		}
	}
	more := len(r.lapsed) > len(ls)
	r.mu.Unlock()
	if len(ls) == 0 {
		return
	}
	k := r.reserve(r.cfg.Workers)
	type reopened struct {
		op      core.Opened
		reps    []reconcile.Report
		claimed []arbortype.Task
	}
	var xact int64
	r.claimMu.RLock()
	o, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (reopened, error) {
		var o reopened
		var err error
		if o.op, err = r.core.Reopen(r.runCtx, tx, ls); err != nil || len(o.op.Leases) == 0 {
			return o, err
		}
		xact = o.op.Xact
		if o.reps, err = recovery.OnOpenMany(r.runCtx, r.core, tx, o.op.Recover, func(string) bool { return false }, r.uncalled); err != nil {
			return o, err
		}
		if k > 0 {
			p := r.claimParams(k)
			p.Conversations = convsOf(o.op.Leases)
			o.claimed, _, err = r.core.ClaimFor(r.runCtx, tx, p)
			if err == nil {
				err = r.fencedClaim()
			}
		}
		return o, err
	})
	if err != nil {
		r.claimMu.RUnlock()
		r.unreserve(k)
		if errors.Is(err, arbortype.ErrAmbiguous) {
			go r.claimFailed(err, xact, "reopening conversations")
		} else {
			r.claimFailed(err, 0, "reopening conversations")
		}
		r.prod.set(false, false, true)
		return
	}
	now := time.Now()
	got := make(map[string]bool, len(o.op.Leases))
	r.mu.Lock()
	for _, l := range o.op.Leases {
		got[l.ConversationID] = true
		if _, still := r.lapsed[l.ConversationID]; still {
			delete(r.lapsed, l.ConversationID)
			r.hold(l, now)
		}
	}
	r.mu.Unlock()
	r.unreserve(k - len(o.claimed))
	r.dispatch(o.claimed)
	r.claimMu.RUnlock()
	r.announceRuns(o.claimed)
	for _, rep := range o.reps {
		if !rep.Empty() {
			r.logger.Info("arbor: conversation re-validated after the node's lease was confirmed again", slog.Any("report", rep))
		}
	}
	// The others: still this life's (another transaction holds them: again
	// shortly), or taken over (forgotten).
	var rest []core.Lease
	for _, l := range ls {
		if !got[l.ConversationID] {
			rest = append(rest, l)
		}
	}
	again := more
	if len(rest) > 0 {
		holderID, _ := r.lease.holder()
		mine, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]core.Lease, error) {
			return r.core.HeldBy(r.runCtx, db, r.cfg.NodeID, holderID)
		})
		if err == nil {
			still := make(map[string]int64, len(mine))
			for _, l := range mine {
				still[l.ConversationID] = l.Epoch
			}
			r.mu.Lock()
			for _, l := range rest {
				if e, ok := still[l.ConversationID]; ok && e == l.Epoch {
					again = true
				} else {
					delete(r.lapsed, l.ConversationID)
				}
			}
			r.mu.Unlock()
		} else {
			again = true
		}
	}
	if again {
		p := r.prod
		p.mu.Lock()
		p.wantReopen = true
		p.mu.Unlock()
		if len(rest) > 0 {
			time.AfterFunc(skippedRetry, p.poke)
		} else {
			p.poke()
		}
	}
}

// convsOf lists the conversations of leases.
func convsOf(ls []core.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ConversationID
	}
	return out
}
