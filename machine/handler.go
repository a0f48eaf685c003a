package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/arborhq/arbor/tasks"
)

// Handler runs one task of a kind. It ends its run by calling one of
// run.Complete, run.Wait (when the wait was not already satisfied) or
// run.SleepUntil, and returning nil. Returning nil without ending the run
// completes the task with no result; returning an error fails it (retried
// under the task's retry policy unless the error wraps
// tasks.ErrNonRetryable). A panic is a failure, not a crash.
//
// ctx is cancelled when the task is aborted or cancelled elsewhere, when the
// machine loses its conversation, when the watchdog gives up on a handler
// blocked past twice its lease, and at the end of the runner's shutdown
// grace. context.Cause(ctx) says which.
type Handler func(ctx context.Context, run *Run) error

// Causes of a handler context's cancellation.
var (
	// ErrTaskStopped: the task was aborted, cancelled or otherwise taken
	// from this run.
	ErrTaskStopped = errors.New("arbor: the task was stopped (aborted, cancelled or taken over)")
	// ErrBlocked: the handler ran past twice its lease without a checkpoint
	// or heartbeat.
	ErrBlocked = errors.New("arbor: handler blocked past twice its lease")
	// ErrShutdown: the runner's shutdown grace ran out.
	ErrShutdown = errors.New("arbor: runner shutting down")
	// errConversationLost: the machine lost its conversation's lease.
	errConversationLost = fmt.Errorf("%w: the conversation's lease was lost", tasks.ErrLeaseLost)
)

// Run is a handler's view of the task it runs and what it may do with it.
// Every write is fenced by the run's token, and runs to its end even if the
// handler's context is cancelled meanwhile (bounded by 30 s): a write of a
// run whose task was taken from it is refused by the database anyway.
type Run struct {
	// Task is the task as it was claimed: input, phase, state, attempt, the
	// ids of its last wait (WaitIDs) and the rest.
	Task tasks.Task

	engine *tasks.Engine
	lease  time.Duration

	mu       sync.Mutex
	ended    bool
	deadline time.Time // local estimate of the task lease's end
}

// writeTimeout bounds one write of a run (see writeCtx).
const writeTimeout = 30 * time.Second

// writeCtx is the context a run's write runs under: ctx's values, but not
// its cancellation. A handler's context is cancelled when its task is
// stopped, and that can happen while the handler's own write is committing
// (its Complete settles the task, the machine hears of it and cancels the
// handler): cutting the connection then would turn a committed write into
// ErrAmbiguous. A write of a run whose task was taken from it is refused by
// the database (ErrAborted, ErrNotRunning, ErrLeaseLost) whatever its
// context, so nothing is lost by letting it finish; writeTimeout bounds it.
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

func newRun(engine *tasks.Engine, t tasks.Task) *Run {
	lease := engine.Config().LeaseDuration
	return &Run{Task: t, engine: engine, lease: lease, deadline: time.Now().Add(lease)}
}

// Ended reports whether the run was ended by Complete, Wait or SleepUntil,
// or found to be over (its task taken from it).
func (r *Run) Ended() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

func (r *Run) leaseDeadline() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deadline
}

func (r *Run) extended() {
	r.mu.Lock()
	r.deadline = time.Now().Add(r.lease)
	r.mu.Unlock()
}

// end marks the run over after a write that ended it, or one that found
// the task no longer this run's (nothing more can be written).
func (r *Run) end(err error) {
	if err == nil || errors.Is(err, tasks.ErrLeaseLost) || errors.Is(err, tasks.ErrAborted) || errors.Is(err, tasks.ErrNotRunning) {
		r.mu.Lock()
		r.ended = true
		r.mu.Unlock()
	}
}

// Checkpoint saves phase and state (replacing the last checkpoint) and
// extends the task's lease.
func (r *Run) Checkpoint(ctx context.Context, phase string, state json.RawMessage) error {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	t, err := r.engine.Checkpoint(ctx, r.Task.ID, r.Task.Token, phase, state)
	if err == nil {
		r.Task.Phase, r.Task.State = t.Phase, t.State
		r.extended()
	}
	return err
}

// Heartbeat extends the task's lease.
func (r *Run) Heartbeat(ctx context.Context) error {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	_, err := r.engine.Heartbeat(ctx, r.Task.ID, r.Task.Token)
	if err == nil {
		r.extended()
	}
	return err
}

// SpawnParams describe a child a handler creates.
type SpawnParams struct {
	Kind             string
	Input            json.RawMessage
	Background       bool
	AbandonOnRestart bool
	RestartLimit     int
	MaxRetries       int
	// IdempotencyKey makes a spawn repeated after a crash return the child
	// the first run created. Default: none (a re-run spawns anew).
	IdempotencyKey string
}

// Spawn creates a child of the task, fenced by the run's token: a run that
// lost its task cannot add children to it.
func (r *Run) Spawn(ctx context.Context, p SpawnParams) (tasks.Task, error) {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	child, _, err := r.engine.Create(ctx, tasks.CreateParams{
		ConversationID: r.Task.ConversationID, OwnerID: r.Task.ID, OwnerToken: r.Task.Token,
		Kind: p.Kind, Input: p.Input, Background: p.Background, AbandonOnRestart: p.AbandonOnRestart,
		RestartLimit: p.RestartLimit, MaxRetries: p.MaxRetries, IdempotencyKey: p.IdempotencyKey,
	})
	return child, err
}

// Children reads every child of the task, with its status, result and error.
func (r *Run) Children(ctx context.Context) ([]tasks.Task, error) {
	return r.engine.Children(ctx, r.Task.ID)
}

// Waited reads the children of the task's last wait, in id order: after a
// wake, their outcomes.
func (r *Run) Waited(ctx context.Context) ([]tasks.Task, error) {
	if len(r.Task.WaitIDs) == 0 {
		return nil, nil
	}
	return r.engine.GetMany(ctx, r.Task.WaitIDs)
}

// Complete ends the run with result (completing, if foreground children are
// still live).
func (r *Run) Complete(ctx context.Context, result json.RawMessage) error {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	_, err := r.engine.Complete(ctx, r.Task.ID, r.Task.Token, result)
	r.end(err)
	return err
}

// Wait parks the task until the children satisfy policy, saving phase and
// state. satisfied is true when the wait already was: the run goes on (the
// handler continues, reading Waited). Otherwise the run has ended; the
// handler returns, and runs again from phase and state when woken.
func (r *Run) Wait(ctx context.Context, childIDs []int64, policy tasks.WaitPolicy, phase string, state json.RawMessage) (satisfied bool, err error) {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	res, err := r.engine.WaitForChildren(ctx, r.Task.ID, r.Task.Token, tasks.WaitParams{
		ChildIDs: childIDs, Policy: policy, Phase: phase, State: state})
	if err != nil {
		r.end(err)
		return false, err
	}
	r.Task = res.Task
	if res.Satisfied {
		r.extended()
		return true, nil
	}
	r.end(nil)
	return false, nil
}

// SleepUntil parks the task until t, saving phase and state. The run ends.
func (r *Run) SleepUntil(ctx context.Context, t time.Time, phase string, state json.RawMessage) error {
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	_, err := r.engine.SleepUntil(ctx, r.Task.ID, r.Task.Token, t, phase, state)
	r.end(err)
	return err
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
func failure(err error) tasks.TaskError {
	te := tasks.TaskError{Message: err.Error(), NonRetryable: errors.Is(err, tasks.ErrNonRetryable)}
	var p *panicError
	if errors.As(err, &p) {
		te.Code = "panic"
		stack := p.stack
		if len(stack) > 16<<10 {
			stack = stack[:16<<10]
		}
		te.Detail, _ = json.Marshal(map[string]string{"stack": string(stack)})
	}
	return te
}
