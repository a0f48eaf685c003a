package machine

import (
	"errors"
	"slices"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/reconcile"
)

// starter is the runner as its application engine's core.Starter: a
// one-statement root Create in this process asks it for a worker, and the
// statement starts the task under this runner's holder (docs/design.md
// §3.18; docs/architecture.md, "A first run folded into its create").
type starter struct{ r *Runner }

// Grant reserves a worker for a root task of kind and read-holds the claim
// lock until the create's outcome is known (Done), as a claim's
// transaction does: Stop's barrier waits for it, and an adopt never takes
// its run for an orphan. It gives none while the lease is not usable, or
// the runner is stopping or full: no worker free (a claim of the producer
// leaves a few to the creates, reserveForClaim) or no room to hold one
// more conversation. While workers are scarce, queued work is claimed in
// its fair order and creates queue behind it.
func (s starter) Grant(kind string) core.StartGrant {
	r := s.r
	if _, ok := slices.BinarySearch(r.kinds, kind); !ok || !r.lease.usable(time.Now()) {
		return nil
	}
	// Never waits: while an adopt or Stop's barrier holds (or waits for)
	// the claim lock, the create queues its task instead.
	if !r.claimMu.TryRLock() {
		return nil
	}
	r.mu.Lock()
	ok := r.started && !r.stopping && r.busy < r.cfg.Workers && len(r.held) < r.cfg.Capacity
	if ok {
		r.busy++
	}
	r.mu.Unlock()
	if !ok {
		r.claimMu.RUnlock()
		return nil
	}
	holder, _ := r.lease.holder()
	return &grant{r: r, holder: holder}
}

// grant is one worker a starter reserved.
type grant struct {
	r      *Runner
	holder int64
}

func (g *grant) Holder() int64 { return g.holder }

// Done takes the run the create started, as a claim's: the conversation
// held at the run's epoch, the run noted as not entered yet, then
// dispatched (not started if the fence fired or Stop began meanwhile: the
// task stays running under the lease and is requeued, uncounted, by the
// reopen or the release). A create that did not start the task gives the
// worker back; one whose outcome is unknown has the runner adopt what it
// holds until the database answers (its run, if it landed, is not lost: it
// is adopted, or recovered by the next holder).
func (g *grant) Done(t core.Task, err error) {
	r := g.r
	defer r.claimMu.RUnlock()
	if err != nil || t.Status != arbortype.StatusRunning {
		r.unreserve(1)
		if errors.Is(err, arbortype.ErrAmbiguous) {
			r.unresolved.Store(true)
		}
		return
	}
	r.claimedRuns([]arbortype.Task{t})
	r.mu.Lock()
	took := r.holdStarted(core.Lease{ConversationID: t.ConversationID, Holder: r.cfg.NodeID, HolderID: g.holder, Epoch: t.Epoch}, time.Now())
	r.mu.Unlock()
	if took && r.cfg.OnReconcile != nil {
		// A conversation the runner takes: new, so nothing to recover.
		r.cfg.OnReconcile(reconcile.Report{ConversationID: t.ConversationID})
	}
	r.dispatch([]arbortype.Task{t})
	r.announceRuns([]arbortype.Task{t})
}
