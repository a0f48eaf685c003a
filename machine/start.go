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

// Runs says whether the runner has a handler for kind.
func (s starter) Runs(kind string) bool {
	_, ok := slices.BinarySearch(s.r.kinds, kind)
	return ok
}

// Grant reserves up to n workers for the tasks a create may start (see
// reserveStart).
func (s starter) Grant(n int) core.StartGrant {
	r := s.r
	k := r.reserveStart(n, "")
	if k == 0 {
		return nil
	}
	holder, _ := r.lease.holder()
	return &grant{r: r, holder: holder, n: k}
}

// emitClaim bounds the workers an emit's claim reserves: it woke one task,
// and its conversation may have a few more waiting.
const emitClaim = 4

// GrantIn reserves workers for the claim an emit makes, in its own
// transaction, in conv (docs/design.md §3.18, "A wake by an event"): only
// when the runner holds conv (not lapsed, not being released), on the
// conditions of Grant.
func (s starter) GrantIn(conv string) core.ClaimGrant {
	r := s.r
	k := r.reserveStart(emitClaim, conv)
	if k == 0 {
		return nil
	}
	p := r.claimParams(k)
	p.Conversations = []string{conv}
	return &claimGrant{r: r, p: p}
}

// reserveStart reserves up to n workers for a create's start (conv "") or
// an emit's claim in conv, and read-holds the claim lock until the grant's
// Done, as a claim's transaction does: Stop's barrier waits for it, and an
// adopt never takes its runs for orphans. It reserves none while the lease
// is not usable, or the runner is stopping or full: no worker free (a
// claim of the producer leaves a few to the creates, reserveForClaim), no
// room to hold one more conversation (a create's), conv not held (an
// emit's). While workers are scarce — no more than startHeadroom free but
// for the claims in flight — it reserves none while the producer knows of
// work waiting: queued work is claimed in its fair order, and creates
// queue behind it.
func (r *Runner) reserveStart(n int, conv string) int {
	if n <= 0 || !r.lease.usable(time.Now()) {
		return 0
	}
	// Never waits: while an adopt or Stop's barrier holds (or waits for)
	// the claim lock, the create queues its tasks instead.
	if !r.claimMu.TryRLock() {
		return 0
	}
	r.mu.Lock()
	// A claim in flight reserved the workers it might need before it
	// knew what it would find; most go back when it ends, within
	// milliseconds: a create that wants more than are free waits for that,
	// a little (claimWait), rather than queue its tasks behind the claim.
	deadline := time.Now().Add(claimWait)
	for conv == "" && r.claiming > 0 && r.cfg.Workers-r.busy < n {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		end := r.claimEnd
		r.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-end:
		case <-t.C:
		}
		t.Stop()
		r.mu.Lock()
	}
	k := 0
	if r.started && !r.stopping {
		k = max(0, min(n, r.cfg.Workers-r.busy))
		if conv == "" {
			k = min(k, max(0, r.cfg.Capacity-len(r.held)))
		} else if h := r.held[conv]; h == nil || h.releasing {
			k = 0
		}
	}
	if k > 0 && r.cfg.Workers-(r.busy-r.claiming) <= startHeadroom {
		// Workers are scarce (few are free but for the claims in flight):
		// a create starts nothing while the producer knows of work waiting,
		// which its claims serve in their fair order (docs/design.md §3.15).
		r.prod.mu.Lock()
		if len(r.prod.dirty) > 0 || len(r.prod.news) > 0 || r.prod.wantOpen {
			k = 0
		}
		r.prod.mu.Unlock()
	}
	r.busy += k
	r.mu.Unlock()
	if k == 0 {
		r.claimMu.RUnlock()
	}
	return k
}

// claimWait bounds how long a grant waits for the producer's claims in
// flight to give back the workers they reserved and did not use.
const claimWait = 20 * time.Millisecond

// grant is the workers a starter reserved for one create.
type grant struct {
	r      *Runner
	holder int64
	n      int
}

func (g *grant) Holder() int64 { return g.holder }
func (g *grant) N() int        { return g.n }

// Done takes the runs the create started, as a claim's: each conversation
// held at its run's epoch, the runs noted as not entered yet, then
// dispatched (not started if the fence fired or Stop began meanwhile: the
// task stays running under the lease and is requeued, uncounted, by the
// reopen or the release). The workers the create did not use go back. A
// create whose outcome is unknown has the runner adopt what it holds until
// the database answers (its runs, if it landed, are not lost: they are
// adopted, or recovered by the next holder).
func (g *grant) Done(started []core.Task, err error) {
	r := g.r
	defer r.claimMu.RUnlock()
	if err != nil {
		started = nil
		if errors.Is(err, arbortype.ErrAmbiguous) {
			r.unresolved.Store(true)
		}
	}
	r.unreserve(g.n - len(started))
	if len(started) == 0 {
		return
	}
	r.claimedRuns(started)
	now := time.Now()
	var took []string
	r.mu.Lock()
	for _, t := range started {
		if r.holdStarted(core.Lease{ConversationID: t.ConversationID, Holder: r.cfg.NodeID, HolderID: g.holder, Epoch: t.Epoch}, now) {
			took = append(took, t.ConversationID)
		}
	}
	r.mu.Unlock()
	for _, c := range took {
		// A conversation the runner takes: new, so nothing to recover.
		r.reconciled(reconcile.Report{ConversationID: c})
	}
	r.dispatch(started)
	r.announceRuns(started)
}

// claimGrant is the workers a starter reserved for an emit's claim.
type claimGrant struct {
	r *Runner
	p core.ClaimParamsFor
}

func (g *claimGrant) Params() core.ClaimParamsFor { return g.p }

// Done takes the runs the emit's claim took (noted as not entered by the
// claim itself, p.Claimed) and dispatches them, as the producer's claim
// does; the workers not used go back. An emit whose commit is unknown is
// resolved, and what it claimed adopted if it landed.
func (g *claimGrant) Done(claimed []core.Task, xact int64, err error) {
	g.r.claimDone(g.p.Limit, claimed, xact, err, "claiming in an emit")
}

// reconciled gives cfg.OnReconcile the report of a conversation the runner
// took, one call at a time.
func (r *Runner) reconciled(rep reconcile.Report) {
	if r.cfg.OnReconcile == nil {
		return
	}
	r.reconcileMu.Lock()
	defer r.reconcileMu.Unlock()
	r.cfg.OnReconcile(rep)
}
