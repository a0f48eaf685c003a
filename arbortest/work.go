package arbortest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// WorkOutcome says how a run of a handler by Work ended, as the task reads
// after it. Unlike machine.OutcomeKind (what a Middleware and an Observer
// see), it tells a failure that is retried (WorkRetried) from one that is
// not (WorkFailed).
type WorkOutcome string

const (
	// WorkCompleted: the run completed the task (Complete, or the
	// handler returned nil). The task is completed, or completing while
	// foreground children are live.
	WorkCompleted WorkOutcome = "completed"
	// WorkFailed: the handler's error (or panic) failed the task for
	// good: no retry was left, or the error was machine.NonRetryable; or a
	// reservation over a budget whose action is fail (the default) failed
	// it, code "budget_exhausted", never retried.
	WorkFailed WorkOutcome = "failed"
	// WorkRetried: the handler's error failed the run, and the task
	// sleeps until its retry (its Retries counts it, its Error records it).
	WorkRetried WorkOutcome = "retried"
	// WorkWaiting: the run parked the task on its children (Wait). With
	// Woken, the wait was satisfied already and the task is pending again.
	WorkWaiting WorkOutcome = "waiting"
	// WorkSleeping: the run parked the task until a time (SleepUntil).
	WorkSleeping WorkOutcome = "sleeping"
	// WorkAwaiting: the run parked the task on an event (AwaitEvent),
	// or a reservation over a budget whose action is park parked it on
	// arbortype.BudgetEvent until a budget is raised. With Woken, the event
	// had been emitted already and the task is pending again.
	WorkAwaiting WorkOutcome = "awaiting"
	// WorkStopped: the task was taken from the run before it ended (it
	// was aborted or cancelled meanwhile): the run wrote no ending.
	WorkStopped WorkOutcome = "stopped"
)

// WorkResult is what one run of a handler did.
type WorkResult struct {
	// Outcome says how the run ended.
	Outcome WorkOutcome
	// Woken: the run's wait or await was satisfied when it was written,
	// and the task is pending again (a Runner would call the handler again
	// at once; Work it again).
	Woken bool
	// Err is what the handler returned; a panic is an error here, as it is
	// the task's failure (code "panic").
	Err error
	// Task is the task read back after the run.
	Task arbortype.Task
	// Spawned are the children the run created, in id order, read back
	// after the run. A spawn whose idempotency key returned an existing
	// child created nothing.
	Spawned []arbortype.Task
}

// Work runs handler once on the task taskID, as a Runner would run it, and
// returns what the run did. The task must be pending (created, woken, or
// due to retry), and its conversation free: no Runner or Lease may hold it.
//
// Work takes the conversation's lease (recovering what an earlier holder
// left running, as a take-over does), starts the task, calls handler with a
// machine.Run of it, and ends a run the handler left open by the Runner's
// rules: nil completes the task with no result, an error fails it (retried
// under its policy unless machine.NonRetryable), a panic fails it with code
// "panic". Every spawn and ending write is the transaction of a Runner's
// completer. The lease is released before Work returns, so the next Work,
// or a Runner, can take the conversation. Two Works on one conversation do
// not overlap: the second, while the first runs, finds the lease held.
// The handler's context is ctx: an abort made meanwhile refuses the run's
// next write (WorkStopped) rather than cancelling ctx.
//
// Work fails the test when arbor refuses to run the task (tb.Fatalf, and
// nothing is written) or when the database fails the run; it returns nil
// then, for a tb that does not stop the test.
func Work(ctx context.Context, tb testing.TB, engine *tasks.Engine, handler machine.Handler, taskID int64) *WorkResult {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.Work: the engine is nil")
		return nil
	}
	if handler == nil {
		tb.Fatalf("arbortest.Work: the handler of task %d is nil", taskID)
		return nil
	}
	before, err := engine.Children(ctx, taskID)
	if err != nil {
		tb.Fatalf("arbortest.Work: %v", err)
		return nil
	}
	rep, err := workOnce(ctx, engine, taskID, handler)
	if err != nil {
		tb.Fatalf("arbortest.Work: %v", err)
		return nil
	}
	res := &WorkResult{Err: rep.HandlerErr, Woken: rep.Outcome.Woken}
	if res.Task, err = engine.Get(ctx, taskID); err != nil {
		tb.Fatalf("arbortest.Work: read task %d back: %v", taskID, err)
		return nil
	}
	after, err := engine.Children(ctx, taskID)
	if err != nil {
		tb.Fatalf("arbortest.Work: read the children of task %d back: %v", taskID, err)
		return nil
	}
	for _, c := range after {
		if !slices.ContainsFunc(before, func(b arbortype.Task) bool { return b.ID == c.ID }) {
			res.Spawned = append(res.Spawned, c)
		}
	}
	res.Outcome = outcome(rep, res.Task)
	return res
}

// workOnce takes the lease of taskID's conversation (recovering what an
// earlier holder left, as a take-over does), runs handler on the task with
// machine.Lease.Work, and releases the lease. The release recovers
// whatever is still running under the lease (a run a database fault left
// open), so that nothing of the test's run can write after it.
func workOnce(ctx context.Context, engine *tasks.Engine, taskID int64, handler machine.Handler) (machine.WorkReport, error) {
	var rep machine.WorkReport
	cur, err := engine.Get(ctx, taskID)
	if err != nil {
		return rep, err
	}
	lease, err := machine.AcquireLease(ctx, engine, cur.ConversationID, &machine.LeaseConfig{Holder: holderName()})
	if err != nil {
		return rep, fmt.Errorf("task %d: %w", taskID, err)
	}
	rep, err = lease.Work(ctx, taskID, handler)
	if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("task %d: %w", taskID, rerr)
	}
	return rep, err
}

// holderName names the leases Work takes, as arbor ls shows them.
func holderName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("arbortest-%s-%d", host, os.Getpid())
}

// outcome names how a run ended from what machine reported and the task
// read back.
func outcome(rep machine.WorkReport, t arbortype.Task) WorkOutcome {
	switch rep.Outcome.Kind {
	case machine.OutcomeCompleted:
		return WorkCompleted
	case machine.OutcomeWaiting:
		return WorkWaiting
	case machine.OutcomeSleeping:
		return WorkSleeping
	case machine.OutcomeAwaiting:
		return WorkAwaiting
	case machine.OutcomeFailed:
		if t.Status == arbortype.StatusFailed {
			return WorkFailed
		}
		return WorkRetried
	}
	return WorkStopped
}

// Worker runs the handlers of several kinds, picking each task's by its
// kind, as a Runner's handler map does: a test that works a turn and its
// tool calls with one value.
type Worker struct {
	engine   *tasks.Engine
	handlers map[string]machine.Handler
}

// NewWorker returns a Worker of handlers (by kind) on engine. It fails the
// test for a nil engine, no handlers, or a nil handler.
func NewWorker(tb testing.TB, engine *tasks.Engine, handlers map[string]machine.Handler) *Worker {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.NewWorker: the engine is nil")
		return nil
	}
	if len(handlers) == 0 {
		tb.Fatalf("arbortest.NewWorker: no handlers")
		return nil
	}
	for kind, h := range handlers {
		if h == nil {
			tb.Fatalf("arbortest.NewWorker: the handler of kind %q is nil", kind)
			return nil
		}
	}
	return &Worker{engine: engine, handlers: handlers}
}

// Work runs the handler of the task's kind once on the task (see the
// function Work). A kind without a handler fails the test.
func (w *Worker) Work(ctx context.Context, tb testing.TB, taskID int64) *WorkResult {
	tb.Helper()
	t, err := w.engine.Get(ctx, taskID)
	if err != nil {
		tb.Fatalf("arbortest.Worker.Work: %v", err)
		return nil
	}
	h, ok := w.handlers[t.Kind]
	if !ok {
		tb.Fatalf("arbortest.Worker.Work: task %d is of kind %q, which has no handler here", taskID, t.Kind)
		return nil
	}
	return Work(ctx, tb, w.engine, h, taskID)
}
