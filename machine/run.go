package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// Handler runs one task of a kind. It ends its run with one of the Run's
// ending calls and returns what that call returned:
//
//	return run.Complete(ctx, result)          // done; the result is recorded
//	return run.Wait(ctx, machine.WaitParams{…}) // parked on children; runs again, from the wait's phase, when they satisfy it
//	return run.SleepUntil(ctx, t, phase, state) // parked until t; runs again from phase
//
// After Wait or SleepUntil the handler always returns: the next step runs in
// a later call of the handler, whose run.Task.Phase is the phase the wait or
// sleep saved. A wait whose children have all settled already is no
// exception: the task is woken at once and the handler is called again, so
// the code after a wait is never the place that reads the children.
//
// Returning nil without ending the run completes the task with no result
// (null): a handler whose work is a side effect needs no Complete.
// Returning an error fails the task, retried under its retry policy unless
// the error wraps arbortype.ErrNonRetryable (see NonRetryable); an error of arbor's
// own that says the run is over (arbortype.ErrAborted, arbortype.ErrNotRunning,
// arbortype.ErrLeaseLost) fails nothing: the task was stopped or taken from
// this run. A panic is a failure (with the panic and its stack), not a
// crash.
//
// ctx is cancelled when the task is aborted, cancelled or past its
// deadline (failed, code "deadline_exceeded") elsewhere, when the runner
// cannot confirm its lease in time or lost it, at the end of the runner's
// shutdown grace, and, with RunnerConfig.BlockedAfter set, when the handler
// ran that long outside arbor's calls without a checkpoint or heartbeat.
// context.Cause(ctx) says which. Once ctx is cancelled, every call of run
// returns at once (with an error whose chain holds the cause), and the
// handler should return: its task is no longer its own to advance, and the
// lease it ran under may be taken over a quarter of a conversation lease
// later (docs/guarantees.md, "When a handler is stopped"). Check ctx (its
// Err method also reads the node's lease against the clock) before each
// side effect that must not happen twice.
type Handler func(ctx context.Context, run *Run) error

// Causes of a handler context's cancellation.
var (
	// ErrTaskStopped: the task was aborted, cancelled or otherwise taken
	// from this run.
	ErrTaskStopped = errors.New("arbor: the task was stopped (aborted, cancelled or taken over)")
	// ErrBlocked: the handler ran past RunnerConfig.BlockedAfter outside
	// arbor's calls without a checkpoint or heartbeat.
	ErrBlocked = errors.New("arbor: handler blocked past RunnerConfig.BlockedAfter without a checkpoint or heartbeat")
	// ErrShutdown: the runner's shutdown grace ran out.
	ErrShutdown = errors.New("arbor: runner shutting down")
)

// NonRetryable wraps err so that the task it fails is not retried;
// errors.Is and errors.As still see err. NonRetryable(nil) is nil.
func NonRetryable(err error) error { return core.NonRetryable(err) }

// Run is a handler's view of the task it runs and what it may do with it.
// Every write is fenced by the run's token: once the task is taken from the
// run (aborted, cancelled, recovered by another holder), every write is
// refused and nothing is written. A call whose context is cancelled returns
// at once; a write it had sent already runs to its end in the background
// (bounded by 30 s), so that a write already committing is not turned into
// arbortype.ErrAmbiguous — and, its context being cancelled, the run is over
// either way.
//
// A Runner's runs send their spawns and ending calls through its batching
// completer: the call returns when the batch it went in has committed, with
// this run's own outcome. A Lease's runs write each in a transaction of its
// own. The calls and their results are the same.
type Run struct {
	// Task is the task as it was claimed for this run: its input, phase and
	// state, attempt, the ids of its last wait (WaitIDs) and the rest.
	// Changing it changes nothing in the database.
	Task arbortype.Task

	core  *core.Engine
	sink  sink
	token int64
	// id, conv and waitIDs are the task's, as claimed: every write of the
	// run is addressed by them, whatever the handler does to Task.
	id      int64
	conv    string
	waitIDs []int64

	mu        sync.Mutex
	ended     bool
	endedInTx bool         // ended by a …Tx form: landed only if the caller's tx committed
	halted    *atomic.Bool // set when its Runner stopped (nil: a Lease's run)
	ending    bool         // its ending write is queued or sent: the watchdog leaves it alone
	// deciding counts its writes in flight that may end it (a reservation
	// over a budget fails or parks the task in its own transaction): the
	// watchdog leaves it alone meanwhile too, and looks again after if it
	// left it alone for that reason (missed).
	deciding   int
	missed     bool
	inHandler  bool      // its handler is being called (execute)
	inCall     int       // arbor calls in progress: time in them is not the handler's
	lastActive time.Time // the start, or the end of the handler's last arbor call
	spawns     int       // spawns without a key of the caller's, numbered for their keys
	budgets    int       // reservations and spends, numbered for their keys
	outcome    Outcome   // how the run ended (see Outcome)
	handlerErr error     // the error fail records, for the outcome
	// cutOff is the run's last ending write when a fault cut it off
	// (ErrUnavailable, or ErrAmbiguous left unknown): the runner writes it
	// again rather than call the handler again (execute).
	cutOff *core.Outcome
}

func newRun(c *core.Engine, s sink, t arbortype.Task) *Run {
	return &Run{Task: t, core: c, sink: s, token: t.Token, id: t.ID, conv: t.ConversationID,
		waitIDs: slices.Clone(t.WaitIDs), lastActive: time.Now()}
}

// handlerRunning reports whether the run's handler is being called (not
// yet entered, or returned: false).
func (r *Run) handlerRunning() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inHandler
}

// Ended reports whether the run is over: ended by Complete, Wait or
// SleepUntil, or found to be over (its task taken from it).
func (r *Run) Ended() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// Checkpoint saves phase and state (replacing the last checkpoint as a
// whole) and extends the task lease. A handler that is recovered after a
// crash runs again from its last checkpoint. It is one statement, which
// commits on its own; a refused one reads the task back to say why.
func (r *Run) Checkpoint(ctx context.Context, phase string, state json.RawMessage) error {
	t, err := writeAtOnce(ctx, r, func(ctx context.Context, db store.DB) (arbortype.Task, error) {
		return r.core.Checkpoint(ctx, db, r.conv, r.id, r.token, phase, state)
	})
	if err == nil {
		r.Task.Phase, r.Task.State = t.Phase, t.State
		r.extended()
	}
	r.over(err)
	return err
}

// Heartbeat extends the task lease, for a handler that works long between
// checkpoints. It is one statement, as Checkpoint is.
func (r *Run) Heartbeat(ctx context.Context) error {
	_, err := writeAtOnce(ctx, r, func(ctx context.Context, db store.DB) (arbortype.Task, error) {
		return r.core.Heartbeat(ctx, db, r.conv, r.id, r.token)
	})
	if err == nil {
		r.extended()
	}
	r.over(err)
	return err
}

// Complete ends the run with result. The task becomes completed, or
// completing while foreground children are still live (it holds the result
// and completes when the last of them settles); its owner is reconciled in
// the same transaction (a waiting owner may wake).
func (r *Run) Complete(ctx context.Context, result json.RawMessage) error {
	return r.finish(ctx, core.Outcome{Kind: core.OutComplete, Result: result})
}

// WaitParams describe a wait for children.
type WaitParams struct {
	// ChildIDs are the children to wait on: each must be the task's own
	// child. Duplicates count once; an empty list is satisfied at once.
	ChildIDs []int64
	// Policy is arbortype.AllSettled or arbortype.FailFast. Required.
	Policy arbortype.WaitPolicy
	// Phase and State are saved with the wait: the handler runs again from
	// them when the wait is satisfied.
	Phase string
	State json.RawMessage
}

// IDs returns the ids of ts, in their order: the ChildIDs of a wait on the
// children a SpawnMany (or several Spawns) returned.
//
//	kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "search"}, {Kind: "fetch"}})
//	if err != nil {
//		return err
//	}
//	return run.Wait(ctx, machine.WaitParams{ChildIDs: machine.IDs(kids), Policy: arbortype.AllSettled, Phase: "answer"})
func IDs(ts []arbortype.Task) []int64 {
	ids := make([]int64, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	return ids
}

// Wait ends the run, parking the task until its children satisfy p.Policy
// (all settled, or the first that did not complete under fail_fast, which
// aborts the others); the handler then runs again with run.Task.Phase =
// p.Phase and reads the outcomes with Waited. A wait that is satisfied
// already wakes the task in the same transaction: the handler runs again at
// once, the same way. Either way the handler returns after Wait.
func (r *Run) Wait(ctx context.Context, p WaitParams) error {
	return r.finish(ctx, core.Outcome{Kind: core.OutWait, Wait: core.WaitParams(p)})
}

// SleepUntil ends the run, parking the task until t (by the database's
// clock) with phase and state saved; the handler runs again from them. A
// River job in the same transaction guarantees the wake; the runner's local
// timers make it on time.
func (r *Run) SleepUntil(ctx context.Context, t time.Time, phase string, state json.RawMessage) error {
	return r.finish(ctx, core.Outcome{Kind: core.OutSleep, WakeAt: t, Phase: phase, State: state})
}

// fail ends the run with the handler's error (retried under the task's
// policy unless non-retryable).
func (r *Run) fail(ctx context.Context, handlerErr error) error {
	r.handlerErr = handlerErr
	return r.finish(ctx, core.Outcome{Kind: core.OutFail, Error: failure(handlerErr)})
}

// callHandler runs h, turning a panic into an error that carries the stack.
func callHandler(ctx context.Context, h Handler, run *Run) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
		}
	}()
	return h(ctx, run)
}

type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.value) }

// failure turns a handler's error into the task's recorded error.
func failure(err error) arbortype.TaskError {
	te := core.NewTaskError(err)
	var p *panicError
	if errors.As(err, &p) {
		te.Code = arbortype.CodePanic
		stack := p.stack
		if len(stack) > 16<<10 {
			stack = stack[:16<<10]
		}
		te.Detail, _ = json.Marshal(map[string]string{"stack": string(stack)})
	}
	return te
}
