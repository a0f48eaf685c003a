package machine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/internal/workhook"
	"github.com/arborhq/arbor/tasks"
)

// A test's run of one handler on one task (package arbortest, through
// internal/workhook): what a Runner does for a run it claimed, without the
// Runner. The task is started under a lease of its own on the conversation
// (so that no Runner touches it meanwhile, and recovery runs first, as a
// take-over's would); the handler is called once, under the same panic
// guard; a run it left open is ended by the runner's rules (nil completes,
// an error fails); and every spawn and ending write goes through the
// completer's transaction (core.Engine.Flush, a batch of one that claims nothing).
// Unlike a Runner it does not call the handler again after a database
// fault: that is reported to the test.

func init() { workhook.Work = workOnce }

func workOnce(ctx context.Context, engine *tasks.Engine, taskID int64, handler any) (workhook.Report, error) {
	var rep workhook.Report
	h, _ := handler.(Handler)
	if h == nil {
		return rep, fmt.Errorf("task %d: the handler is nil: %w", taskID, tasks.ErrInvalidArgument)
	}
	c := core.Of(engine)
	if c == nil {
		return rep, fmt.Errorf("task %d: the engine is nil: %w", taskID, tasks.ErrInvalidArgument)
	}
	cur, err := core.Read(ctx, c, func(db store.DB) (arbortype.Task, error) { return c.Get(ctx, db, taskID) })
	if err != nil {
		return rep, err
	}
	lease, err := AcquireLease(ctx, engine, cur.ConversationID, &LeaseConfig{Holder: "arbortest-" + defaultHolder()})
	if err != nil {
		return rep, fmt.Errorf("task %d: %w", taskID, err)
	}
	rep, err = workLeased(ctx, c, lease, taskID, h)
	// The release recovers whatever is still running under the lease (a
	// run a database fault left open), so that nothing of the test's run
	// can write after it.
	if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("task %d: %w", taskID, rerr)
	}
	return rep, err
}

func workLeased(ctx context.Context, c *core.Engine, lease *Lease, taskID int64, h Handler) (workhook.Report, error) {
	var rep workhook.Report
	t, err := core.Tx(ctx, c, func(tx pgx.Tx) (core.Task, error) { return c.Start(ctx, tx, lease.lease, taskID) })
	if err != nil {
		return rep, err
	}
	rep.Started = t
	sink := &flushSink{core: c, holder: lease.lease.HolderID}
	run := newRun(c, sink, t)
	err = callHandler(ctx, h, run)
	rep.HandlerErr = err
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
	rep.Ending, rep.Ended, rep.Woken, rep.EndErr = sink.last.Kind, sink.hasEnded, sink.lastRes.Woken, sink.lastRes.Err
	if !rep.Ended {
		// A reservation over a budget that fails or parks ended the run in
		// its own transaction, not through the sink: the task failed, or
		// awaits the budget's raise.
		run.mu.Lock()
		switch run.outcome.Kind {
		case OutcomeFailed:
			rep.Ending, rep.Ended = core.OutFail, true
		case OutcomeAwaiting:
			rep.Ending, rep.Ended = core.OutAwait, true
		}
		run.mu.Unlock()
	}
	return rep, nil
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
			return s.core.Flush(ctx, tx, []core.Outcome{o}, core.ClaimParamsFor{Holder: s.holder}, slow, &xact)
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
		case errors.Is(err, tasks.ErrAmbiguous) && ctx.Err() == nil:
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
