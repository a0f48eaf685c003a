package machine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// Work starts the pending task taskID under the lease and runs handler on
// it once, as a Runner runs a run it claimed: the handler is called under
// the Runner's panic guard; a run it left open is ended by the Runner's
// rules (nil completes the task with no result, an error fails it —
// retried under its policy unless NonRetryable — a panic fails it with
// code "panic"); and every spawn and ending write is applied as a
// Runner's completer applies it. A Lease's runs from Start write each call
// on its own instead. The handler's context is ctx: an abort made
// meanwhile refuses the run's next write rather than cancelling ctx.
//
// Work's error is a refusal to start the task, as Start's, or a database
// fault that cut the run off before it ended: the task is then still
// running under the lease, and Release recovers it. Unlike a Runner, Work
// does not call the handler again after such a fault. Package arbortest's
// Work is built on it.
func (l *Lease) Work(ctx context.Context, taskID int64, handler Handler) (WorkReport, error) {
	var rep WorkReport
	if handler == nil {
		return rep, fmt.Errorf("task %d: the handler is nil: %w", taskID, arbortype.ErrInvalidArgument)
	}
	t, err := core.Tx(ctx, l.core, func(tx pgx.Tx) (core.Task, error) { return l.core.Start(ctx, tx, l.lease, taskID) })
	if err != nil {
		return rep, err
	}
	c := l.core
	sink := &flushSink{core: c, holder: l.lease.HolderID}
	run := newRun(c, sink, t)
	rep.HandlerErr = callHandler(ctx, handler, run)
	err = rep.HandlerErr
	switch {
	case run.Ended() && run.endedInTxForm():
		// The transaction committed, or confirmTxEnding failed the run
		// through the sink.
		confirmTxEnding(ctx, c, run)
		sink.mu.Lock()
		viaSink := sink.hasEnded
		sink.mu.Unlock()
		if !viaSink && run.Ended() {
			sink.ended(core.Outcome{Kind: core.OutComplete}, core.OutcomeResult{})
		}
	case run.Ended() || runOver(err):
	case infrastructure(err):
		return rep, fmt.Errorf("task %d: the handler was cut off from the database: %w", taskID, err)
	case err == nil:
		err = run.Complete(ctx, nil)
	default:
		err = run.fail(ctx, err)
	}
	if err != nil && infrastructure(err) {
		return rep, fmt.Errorf("task %d: ending the run: %w", taskID, err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	switch {
	case sink.hasEnded:
		rep.Outcome = outcomeOf(sink.last, sink.lastRes)
		if rep.Outcome.Kind == OutcomeFailed {
			rep.Outcome.Err = rep.HandlerErr
		}
	default:
		// No ending write landed through the sink. A reservation over a
		// budget that fails or parks ended the run in its own transaction:
		// the task failed, or awaits the budget's raise. Else the task was
		// taken from the run.
		run.mu.Lock()
		switch run.outcome.Kind {
		case OutcomeFailed, OutcomeAwaiting:
			rep.Outcome = run.outcome
		default:
			rep.Outcome = Outcome{Kind: OutcomeNone, Err: cmp.Or(sink.lastRes.Err, rep.HandlerErr)}
		}
		run.mu.Unlock()
	}
	return rep, nil
}

// WorkReport is what a run of Lease.Work did.
type WorkReport struct {
	// Outcome is how the run ended, as a Middleware's next returns it:
	// OutcomeNone when the task was taken from the run before it ended
	// (aborted or cancelled meanwhile). With Woken, its wait or await was
	// satisfied when written, and the task is pending again.
	Outcome Outcome
	// HandlerErr is what the handler returned; a panic is an error here,
	// as it is the task's failure (code "panic").
	HandlerErr error
}

// flushSink applies each write of a run alone in the completer's
// transaction — core.Engine.Flush of a batch of one, the set-based path first and
// the one-by-one path when the database refuses it, as the completer does —
// claiming nothing, and records the run's last ending write.
type flushSink struct {
	core   *core.Engine
	holder int64

	mu       sync.Mutex
	last     core.Outcome
	lastRes  core.OutcomeResult
	hasEnded bool
}

func (*flushSink) ending(*Run) {}

func (*flushSink) recheck(*Run) {}

func (s *flushSink) ended(o core.Outcome, res core.OutcomeResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.lastRes = o, res
	s.hasEnded = res.Err == nil
}

// apply flushes o. A commit whose outcome is unknown is resolved as a
// Lease's run resolves it (see directSink.apply).
func (s *flushSink) apply(ctx context.Context, _ *Run, o core.Outcome) core.OutcomeResult {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	slow := false
	for try := 0; ; try++ {
		var xact int64
		res, err := core.Tx(ctx, s.core, func(tx pgx.Tx) (core.FlushResult, error) {
			return s.core.Flush(ctx, tx, []core.Outcome{o}, core.ClaimParamsFor{Holder: s.holder}, slow, &xact, nil)
		})
		var out core.OutcomeResult
		switch {
		case err == nil && len(res.Deferred) > 0:
			// Another transaction holds the conversation (the test's own,
			// say): the flush skipped it; again once it may be free.
			if !sleepCtx(ctx, deferredWait(try)) {
				return core.OutcomeResult{Err: fmt.Errorf("task %d: %w", o.TaskID, ctx.Err())}
			}
			continue
		case err == nil:
			s.core.AnnounceLog(o.ConversationID)
			out = res.Results[0]
		case errors.Is(err, arbortype.ErrAmbiguous) && ctx.Err() == nil:
			if o.Kind == core.OutSpawn {
				continue // idempotent by its keys
			}
			done, rerr := resolveEnding(ctx, s.core, o)
			if rerr == nil && !done {
				continue // it did not land
			}
			if rerr == nil {
				rerr = endedBy(ctx, s.core, o)
			}
			out = core.OutcomeResult{Err: rerr}
		case !slow && !infrastructure(err):
			slow = true
			continue
		default:
			out = core.OutcomeResult{Err: err}
		}
		if o.Kind != core.OutSpawn {
			s.ended(o, out)
		}
		return out
	}
}
