package machine

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// active is a run of this node: running its handler, or waiting for the
// previous handler of its task to return.
type active struct {
	run   *Run
	token int64
	kind  string
	conv  string
	epoch int64 // the conversation's lease epoch the run was claimed under
	ctx   context.Context
	// base is ctx without the lease's clock check: cancelled by a stop
	// (the fence's included, under r.mu) and nothing else. Read it under
	// r.mu: ctx.Err may fire the fence, which takes r.mu.
	base    context.Context
	cancel  context.CancelCauseFunc
	warned  bool
	slot    bool // holds a worker slot (until its ending write is queued)
	started bool // its handler was called

	// cancelledAt is when its context was cancelled (zero: not yet);
	// stuckWarned when the watchdog last warned that it had not returned.
	cancelledAt time.Time
	stuckWarned time.Time
}

// stop cancels the run's context with cause, and notes when (under r.mu).
func (a *active) stop(cause error) {
	if a.cancelledAt.IsZero() {
		a.cancelledAt = time.Now()
	}
	a.cancel(cause)
}

// reserve takes up to n free worker slots and returns how many it took.
func (r *Runner) reserve(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return 0
	}
	k := min(n, r.cfg.Workers-r.busy)
	if k < 0 {
		k = 0
	}
	r.busy += k
	return k
}

// startHeadroom is how many free workers a claim of the producer leaves to
// the creates of this process, which start their tasks themselves
// (start.go): at most this many, and at most half of those free, so that a
// claim in flight, which reserves its workers before it knows what it
// finds, does not make every create meanwhile queue its task instead.
const startHeadroom = 16

// reserveForClaim reserves workers for a claim or an open of the
// producer: every free worker but the creates' headroom, at least one
// when one is free. claimed says the claim is over (its workers given back
// or taken by its runs).
func (r *Runner) reserveForClaim() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return 0
	}
	free := r.cfg.Workers - r.busy
	k := max(0, min(free, max(1, free-min(startHeadroom, free/2))))
	r.busy += k
	r.claiming += k
	return k
}

// claimed ends a claim's reservation of k workers (see reserveForClaim).
func (r *Runner) claimed(k int) {
	r.mu.Lock()
	r.claiming -= k
	close(r.claimEnd)
	r.claimEnd = make(chan struct{})
	r.mu.Unlock()
}

// isStopping reports whether Stop has begun.
func (r *Runner) isStopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// unreserve gives back n reserved slots that a claim did not use.
func (r *Runner) unreserve(n int) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	r.busy -= n
	r.mu.Unlock()
	r.prod.poke()
}

// dispatch starts the handlers of claimed tasks, each on a slot reserved
// for it.
//
//   - A run of a conversation this runner no longer holds at the run's
//     epoch (given up, lapsed) is not started: its task stays running until
//     recovery (a reopen, a release, the next holder) requeues it.
//   - Nor is any run while the node's lease is not usable (the fence is
//     due or fired): the fence fires, and the conversations are re-validated
//     before anything of theirs runs.
//   - Nor is any run once the runner is stopping: the release requeues it,
//     uncounted (a claim in flight when Stop began commits before the
//     drain; see Stop).
//   - A run of a task whose previous handler here has not returned waits
//     for it (see runDone).
func (r *Runner) dispatch(claimed []arbortype.Task) {
	if len(claimed) == 0 {
		return
	}
	now := time.Now()
	var start []*active
	fire := false
	r.mu.Lock()
	usable := r.lease.usable(now)
	for _, t := range claimed {
		h := r.held[t.ConversationID]
		if !usable || r.stopping || h == nil || h.lease.Epoch != t.Epoch {
			r.busy--
			fire = fire || !usable
			continue
		}
		a := r.newActive(t)
		r.liveIn[t.ConversationID]++
		if r.runs[t.ID] != nil {
			if old := r.waiting[t.ID]; old != nil {
				r.drop(old) // claimed before this one: its token is dead
			}
			r.waiting[t.ID] = a
			continue
		}
		r.runs[t.ID] = a
		r.handlerWG.Add(1) // under r.mu: before a Stop's drain can wait
		start = append(start, a)
	}
	r.mu.Unlock()
	if fire {
		r.lease.fire()
	}
	for _, a := range start {
		r.start(a)
	}
}

// newActive makes a run's bookkeeping and context (under r.mu).
func (r *Runner) newActive(t arbortype.Task) *active {
	inner, cancel := context.WithCancelCause(r.runCtx)
	run := newRun(r.core, r.comp, t)
	run.halted = &r.halted
	return &active{run: run, token: t.Token, kind: t.Kind, conv: t.ConversationID, epoch: t.Epoch,
		ctx: fencedCtx{Context: inner, lease: r.lease}, base: inner, cancel: cancel, slot: true}
}

// drop forgets a run that will not be started, with its slot (under r.mu).
func (r *Runner) drop(a *active) {
	if a.slot {
		a.slot = false
		r.busy--
	}
	r.liveDone(a.conv)
	a.cancel(context.Canceled)
}

// liveDone counts a run of conv over (under r.mu).
func (r *Runner) liveDone(conv string) {
	if r.liveIn[conv]--; r.liveIn[conv] <= 0 {
		delete(r.liveIn, conv)
		if h := r.held[conv]; h != nil {
			h.idleSince = time.Now()
		}
	}
}

// start runs a's handler on a goroutine of its own; the caller counted it
// in handlerWG, under r.mu.
func (r *Runner) start(a *active) {
	go func() {
		defer r.handlerWG.Done()
		// A run whose context was cancelled before it began (the fence
		// fired, the task was stopped) does not call its handler, and stays
		// unstarted; nor does one whose task the entry check found no
		// longer running under its token (aborted, cancelled or settled
		// since its claim committed). The context is checked first with
		// the lease's clock, outside r.mu (that check may fire the fence,
		// which takes r.mu), then again under r.mu without it: the fence
		// cancels every run under r.mu before it marks their conversations
		// lapsed, so a run entered is off unstarted before any reopen can
		// look.
		call := a.ctx.Err() == nil && r.entries.confirm(a) && a.ctx.Err() == nil
		r.mu.Lock()
		call = call && a.base.Err() == nil
		if call {
			a.started = true
			delete(r.unstarted, a.token)
		}
		r.mu.Unlock()
		if call {
			r.run(a.ctx, a.run)
		}
		a.cancel(context.Canceled)
		r.runDone(a)
	}()
}

// run runs a dispatched run through the middleware, and reports its end to
// the observer.
func (r *Runner) run(ctx context.Context, run *Run) {
	var started time.Time
	if r.cfg.Observer != nil {
		started = time.Now()
	}
	r.runWith(ctx, run)
	if r.cfg.Observer != nil {
		r.cfg.Observer.Observe(Observation{Kind: ObservedRunEnded, Task: &run.Task, Outcome: run.Outcome(),
			Started: started, Ended: time.Now()})
	}
}

// runDone forgets a handler that returned: its entry in runs, its worker
// slot if it still holds one, and its count in its conversation; and
// starts the run of its task that waited for it, if there is one and the
// node may still run it (the flush that applied this run's ending write
// may have made the task runnable again and claimed it before this handler
// returned: an await whose event was waiting, a wait already satisfied).
func (r *Runner) runDone(a *active) {
	id := a.run.id
	var next *active
	r.mu.Lock()
	if r.runs[id] == a {
		delete(r.runs, id)
	}
	if a.slot {
		a.slot = false
		r.busy--
	}
	r.liveDone(a.conv)
	if w := r.waiting[id]; w != nil {
		delete(r.waiting, id)
		h := r.held[w.conv]
		if h != nil && h.lease.Epoch == w.epoch && r.lease.usable(time.Now()) && !r.stopping {
			r.runs[id] = w
			r.handlerWG.Add(1)
			next = w
		} else {
			r.drop(w)
		}
	}
	r.mu.Unlock()
	if next != nil {
		r.start(next)
	}
	r.prod.poke() // a slot is free: the producer may have work waiting for one
}

// ending gives a run's worker slot back when it queues its ending write
// (the completer's flush may hand it to the work that write creates).
func (r *Runner) ending(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.id]; a != nil && a.run == run && a.slot {
		a.slot = false
		r.busy--
	}
	r.mu.Unlock()
}

// retake gives a run whose ending write was cut off its worker slot again,
// before its handler is called again.
func (r *Runner) retake(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.id]; a != nil && a.run == run && !a.slot {
		a.slot = true
		r.busy++
	}
	r.mu.Unlock()
}

// wakeAndClaim is a timer's wake on this node: the sleep ended and, when
// this node holds the conversation and may act, the conversation's
// runnable work claimed (the woken task first among it, oldest first) in
// the same transaction and dispatched at once — no notification and no
// producer between a sleep's time and its handler. A wake whose commit's
// answer was lost is resolved like a claim's (adopt).
func (r *Runner) wakeAndClaim(ctx context.Context, taskID, sleepSeq int64, conv string) (bool, error) {
	r.mu.Lock()
	h := r.held[conv]
	r.mu.Unlock()
	k := 0
	if h != nil && r.lease.usable(time.Now()) {
		k = r.reserve(1)
	}
	var (
		claimed []arbortype.Task
		xact    int64
	)
	r.claimMu.RLock()
	woken, err := core.Tx(ctx, r.core, func(tx pgx.Tx) (bool, error) {
		claimed = nil
		woken, err := r.core.WakeSleeping(ctx, tx, taskID, sleepSeq)
		if err != nil || !woken || k == 0 {
			return woken, err
		}
		p := r.claimParams(k)
		p.Conversations = []string{conv}
		claimed, xact, err = r.core.ClaimFor(ctx, tx, p)
		return woken, err
	})
	r.claimDone(k, claimed, xact, err, "waking a sleep")
	return woken, err
}

// claimDone ends a claim made in a transaction of another write (a sleep's
// wake, an emit) under k reserved workers and the claim lock read-held:
// its runs dispatched and the workers they did not take given back, or,
// for err, every worker given back and a commit whose answer was lost
// resolved (what it claimed adopted if it landed).
func (r *Runner) claimDone(k int, claimed []arbortype.Task, xact int64, err error, what string) {
	if err != nil {
		r.claimMu.RUnlock()
		r.unreserve(k)
		if errors.Is(err, arbortype.ErrAmbiguous) && xact != 0 {
			go r.claimFailed(err, xact, what) // adopt waits for claimMu
		}
		return
	}
	r.unreserve(k - len(claimed))
	r.dispatch(claimed)
	r.claimMu.RUnlock()
	r.announceRuns(claimed)
}

// stopRuns cancels, with cause, the runs here of the tasks among ids
// (holding the token given, same index; 0: any), those waiting for their
// task's previous handler included: they are then never entered.
func (r *Runner) stopRuns(ids, tokens []int64, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range ids {
		if a := r.runs[id]; a != nil && (tokens[i] == 0 || a.token == tokens[i]) && !a.run.endingOrEnded() {
			a.stop(cause)
		}
		if w := r.waiting[id]; w != nil && (tokens[i] == 0 || w.token == tokens[i]) {
			w.stop(cause)
		}
	}
}
