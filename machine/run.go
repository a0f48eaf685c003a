package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
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
// the error wraps ErrNonRetryable (see NonRetryable); an error of arbor's
// own that says the run is over (tasks.ErrAborted, tasks.ErrNotRunning,
// tasks.ErrLeaseLost) fails nothing: the task was stopped or taken from
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

// ErrNonRetryable marks a handler's error as final: the task fails at once,
// whatever retries it has left. Wrap an error with NonRetryable. It is
// arbortype.ErrNonRetryable, named here too.
var ErrNonRetryable = arbortype.ErrNonRetryable

// NonRetryable wraps err so that the task it fails is not retried;
// errors.Is and errors.As still see err. NonRetryable(nil) is nil.
func NonRetryable(err error) error { return core.NonRetryable(err) }

// Run is a handler's view of the task it runs and what it may do with it.
// Every write is fenced by the run's token: once the task is taken from the
// run (aborted, cancelled, recovered by another holder), every write is
// refused and nothing is written. A call whose context is cancelled returns
// at once; a write it had sent already runs to its end in the background
// (bounded by 30 s), so that a write already committing is not turned into
// tasks.ErrAmbiguous — and, its context being cancelled, the run is over
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
	inCall     int       // arbor calls in progress: time in them is not the handler's
	lastActive time.Time // the start, or the end of the handler's last arbor call
	spawns     int       // spawns without a key of the caller's, numbered for their keys
	budgets    int       // reservations and spends, numbered for their keys
	outcome    Outcome   // how the run ended (see Outcome)
	handlerErr error     // the error fail records, for the outcome
}

// sink applies a run's spawns and ending writes.
type sink interface {
	// apply applies o and returns its outcome; a commit whose outcome is
	// unknown is resolved before it returns (see directSink.apply).
	apply(ctx context.Context, r *Run, o core.Outcome) core.OutcomeResult
	// ending says that r queued its ending write: a runner gives its worker
	// slot back then.
	ending(r *Run)
	// recheck asks for r's task to be read back, and r stopped if it is no
	// longer r's (see Run.mayEnd).
	recheck(r *Run)
}

// writeTimeout bounds one write of a run (see writeCtx).
const writeTimeout = 30 * time.Second

// writeCtx is the context a run's write runs under: ctx's values, but not
// its cancellation. A handler's context is cancelled when its task is
// stopped, and that can happen while the handler's own write is committing
// (its Complete settles the task, the runner hears of it and cancels the
// handler): cutting the connection then would turn a committed write into
// ErrAmbiguous. A write of a run whose task was taken from it is refused by
// the database (ErrAborted, ErrNotRunning, ErrLeaseLost) whatever its
// context, so nothing is lost by letting it finish; writeTimeout bounds it.
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

func newRun(c *core.Engine, s sink, t arbortype.Task) *Run {
	return &Run{Task: t, core: c, sink: s, token: t.Token, id: t.ID, conv: t.ConversationID,
		waitIDs: slices.Clone(t.WaitIDs), lastActive: time.Now()}
}

// enter begins an arbor call of the handler's: a cancelled ctx refuses it
// at once (the run is over: nothing is sent). Time until the returned
// leave is called is arbor's, not the handler's (see activity).
func (r *Run) enter(ctx context.Context) (leave func(), err error) {
	if ctx.Err() != nil {
		return nil, r.stoppedErr(ctx)
	}
	if r.halted != nil && r.halted.Load() {
		r.mu.Lock()
		r.ended = true
		r.mu.Unlock()
		return nil, fmt.Errorf("task %d: the runner stopped: %w", r.id, ErrShutdown)
	}
	r.mu.Lock()
	r.inCall++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.inCall--
		r.lastActive = time.Now()
		r.mu.Unlock()
	}, nil
}

// stoppedErr is what a call returns when the run's context was cancelled:
// the run is over (nothing more of it is written), and the error's chain
// holds the context's cause.
func (r *Run) stoppedErr(ctx context.Context) error {
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ctx.Err()
	}
	return fmt.Errorf("task %d: the run was stopped: %w", r.id, cause)
}

// activity reports whether an arbor call is in progress, and when the
// handler's last one ended (or the run started): the watchdog counts only
// the time outside arbor's calls.
func (r *Run) activity() (inCall bool, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inCall > 0, r.lastActive
}

// detached runs fn, a write of the run, on a goroutine of its own, and
// returns its result — or, when ctx is cancelled first, at once with the
// run stopped: fn goes on to its end (under writeCtx, bounded), so that a
// write already committing is not cut into an unknown outcome.
func detached[T any](ctx context.Context, r *Run, fn func(ctx context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		wctx, cancel := writeCtx(ctx)
		defer cancel()
		v, err := fn(wctx)
		done <- result{v, err}
	}()
	select {
	case res := <-done:
		return res.v, res.err
	case <-ctx.Done():
		var zero T
		return zero, r.stoppedErr(ctx)
	}
}

// Ended reports whether the run is over: ended by Complete, Wait or
// SleepUntil, or found to be over (its task taken from it).
func (r *Run) Ended() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// endingOrEnded reports whether the run is over or has sent the write
// that ends it, or one that may end it: its task's changing status is its
// own doing, and its context must not be cancelled for it (its handler is
// about to hear the outcome and return). The watchdog asks it before it
// stops a run; a run it leaves alone only for a write that may end it is
// marked missed, to be looked at again when that write is over (mayEnd).
func (r *Run) endingOrEnded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || r.ending {
		return true
	}
	if r.deciding > 0 {
		r.missed = true
		return true
	}
	return false
}

// mayEnd marks a write that may end the run as in flight; the function it
// returns, called when that write is over (landed or not, whatever the
// handler's context did meanwhile), unmarks it and, when the run did not
// end and the watchdog left it alone meanwhile, has the runner look at the
// run again: a stop the watchdog left while the write was in flight (an
// abort meanwhile) is not lost. When the watchdog did not look meanwhile,
// as on a reservation's common path, nothing is read again: the write is
// its one statement.
func (r *Run) mayEnd() func() {
	r.mu.Lock()
	r.deciding++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.deciding--
		again := !r.ended && r.missed && r.deciding == 0
		if again {
			r.missed = false
		}
		r.mu.Unlock()
		if again {
			r.sink.recheck(r)
		}
	}
}

func (r *Run) extended() {
	r.mu.Lock()
	r.lastActive = time.Now()
	r.mu.Unlock()
}

// end marks the run over after a write that ended it, or one that found
// the task no longer this run's (nothing more can be written).
func (r *Run) end(err error) {
	if err == nil || runOver(err) {
		r.mu.Lock()
		r.ended = true
		r.mu.Unlock()
	}
}

// over marks the run over after a write that does not end it (a
// checkpoint, a spawn) found the task no longer this run's.
func (r *Run) over(err error) {
	if err != nil && runOver(err) {
		r.mu.Lock()
		r.ended = true
		r.mu.Unlock()
	}
}

// runOver reports whether err says that the task is no longer this run's.
func runOver(err error) bool {
	return errors.Is(err, tasks.ErrLeaseLost) || errors.Is(err, tasks.ErrAborted) || errors.Is(err, tasks.ErrNotRunning)
}

// write runs one fenced write of the run that does not end it and is not
// batched (a spawn with budgets) in a transaction of its own, detached
// from ctx's cancellation (see detached). Each such write is idempotent, so
// a commit whose outcome is unknown (ErrAmbiguous) is simply written again.
func write[T any](ctx context.Context, r *Run, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	return idempotent(ctx, r, func(wctx context.Context) (T, error) {
		return core.Tx(wctx, r.core, func(tx pgx.Tx) (T, error) { return fn(wctx, tx) })
	})
}

// writeAtOnce is write for a write of one statement, which commits on its
// own (core.Write): one round trip, no transaction around it (a
// checkpoint, a heartbeat, a progress entry, a record). A refused one may
// read the task back after it, to say why.
func writeAtOnce[T any](ctx context.Context, r *Run, fn func(ctx context.Context, db store.DB) (T, error)) (T, error) {
	return idempotent(ctx, r, func(wctx context.Context) (T, error) {
		return core.Write(wctx, r.core, func(db store.DB) (T, error) { return fn(wctx, db) })
	})
}

// idempotent runs w, an idempotent write of the run, as an arbor call of
// the handler's detached from ctx's cancellation, again after each
// ErrAmbiguous while its context lasts.
func idempotent[T any](ctx context.Context, r *Run, w func(wctx context.Context) (T, error)) (T, error) {
	leave, err := r.enter(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer leave()
	return detached(ctx, r, func(wctx context.Context) (T, error) {
		for {
			v, err := w(wctx)
			if !errors.Is(err, tasks.ErrAmbiguous) || wctx.Err() != nil {
				return v, err
			}
		}
	})
}

// finish sends the write that ends the run (complete, wait, sleep, fail).
// A cancelled ctx returns at once (the write, if queued already, still
// lands or is refused by the token's fence).
func (r *Run) finish(ctx context.Context, o core.Outcome) error {
	leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	o.TaskID, o.Token, o.ConversationID = r.id, r.token, r.conv
	r.mu.Lock()
	r.ending = true
	r.mu.Unlock()
	r.sink.ending(r)
	res := r.sink.apply(ctx, r, o)
	r.end(res.Err)
	r.record(o, res, r.handlerErr)
	return res.Err
}

// directSink writes each outcome of a run in a transaction of its own: a
// Lease's runs.
type directSink struct{ core *core.Engine }

func (directSink) ending(*Run) {}

// recheck: a Lease's runs have no watchdog.
func (directSink) recheck(*Run) {}

// apply writes o. A commit whose outcome is unknown is resolved: a spawn,
// idempotent by its keys, is written again; an ending write reads the task
// back — still running under the run's token, it did not land and is
// written again; otherwise the run is over (nil, or ErrAborted for a task
// that was aborted).
func (d directSink) apply(ctx context.Context, r *Run, o core.Outcome) core.OutcomeResult {
	res, err := detached(ctx, r, func(wctx context.Context) (core.OutcomeResult, error) {
		return d.applyDetached(wctx, o), nil
	})
	if err != nil {
		return core.OutcomeResult{Err: err}
	}
	return res
}

func (d directSink) applyDetached(ctx context.Context, o core.Outcome) core.OutcomeResult {
	for {
		res, err := core.Tx(ctx, d.core, func(tx pgx.Tx) (core.OutcomeResult, error) { return d.core.Apply(ctx, tx, o) })
		if !errors.Is(err, tasks.ErrAmbiguous) || ctx.Err() != nil {
			res.Err = err
			return res
		}
		if o.Kind == core.OutSpawn {
			continue
		}
		if done, rerr := resolveEnding(ctx, d.core, o); done || rerr != nil {
			if rerr == nil {
				rerr = endedBy(ctx, d.core, o)
			}
			return core.OutcomeResult{Err: rerr}
		}
	}
}

// resolveEnding reads the task of an ending write whose commit is unknown:
// done when the task is no longer running under the run's token (the write
// landed, or the task was taken from the run), not done when the write
// must be made again.
func resolveEnding(ctx context.Context, c *core.Engine, o core.Outcome) (done bool, err error) {
	cur, err := core.Read(ctx, c, func(db store.DB) (arbortype.Task, error) { return c.Get(ctx, db, o.TaskID) })
	if err != nil {
		return false, fmt.Errorf("%w (reading the task back to resolve it failed: %w)", tasks.ErrAmbiguous, err)
	}
	return !(cur.Status == arbortype.StatusRunning && cur.Token == o.Token), nil
}

// endedBy is what a resolved ending write returns: nil, or ErrAborted for a
// task that was aborted meanwhile.
func endedBy(ctx context.Context, c *core.Engine, o core.Outcome) error {
	cur, err := core.Read(ctx, c, func(db store.DB) (arbortype.Task, error) { return c.Get(ctx, db, o.TaskID) })
	if err == nil && cur.Status == arbortype.StatusAborted {
		return fmt.Errorf("task %d: %w", o.TaskID, tasks.ErrAborted)
	}
	return nil
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

// SpawnParams describe a child a handler creates: the fields of
// tasks.CreateParams a child may set (its conversation and owner are the
// run's; the turn policies and conversation budgets are for turns).
type SpawnParams struct {
	// Kind names the child's handler. Required.
	Kind string
	// Input is the child's JSON input; empty for none.
	Input json.RawMessage
	// Background makes a child that neither holds its owner in completing
	// nor is reached by its owner's abort (a summary written on the side).
	Background bool
	// AbandonOnRestart makes a child that is never re-run after a crash.
	AbandonOnRestart bool
	// RestartLimit is how many recoveries the child survives; 0 means the
	// engine's, tasks.RestartLimitNone none.
	RestartLimit int
	// MaxRetries is how many times a failed run of the child is retried.
	MaxRetries int
	// RetryBackoffBase and RetryBackoffCap are the child's backoff between
	// retries; 0 means the engine's.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// Deadline, when not zero, is when the child, still live, fails with
	// code "deadline_exceeded" and its foreground subtree is aborted.
	Deadline time.Time
	// Budgets are set on the child (a sub-agent's own budget): its
	// subtree's spend is bounded by them as well as by every budget above
	// it. A spawn with budgets is written in a transaction of its own
	// rather than in the runner's batch.
	Budgets []arbortype.BudgetLimit
	// IdempotencyKey makes a spawn repeated after a crash return the child
	// the first run created (keys starting with "arbor:" are arbor's own).
	// Default: a key of the run's own, so that a spawn written again after a
	// lost connection, or repeated by this run's handler when the runner
	// calls it again after a transient fault, returns the same child; a
	// handler run again after a crash (a new run) spawns anew.
	IdempotencyKey string
}

// Spawn creates a child of the task, fenced by the run's token: a run that
// lost its task cannot add children to it.
func (r *Run) Spawn(ctx context.Context, p SpawnParams) (arbortype.Task, error) {
	kids, err := r.SpawnMany(ctx, []SpawnParams{p})
	if err != nil {
		return arbortype.Task{}, err
	}
	return kids[0], nil
}

// SpawnMany creates several children of the task at once, in one statement
// (a turn's parallel tool calls), fenced like Spawn. They come back in the
// order given; one refused child refuses them all, and none is created.
func (r *Run) SpawnMany(ctx context.Context, ps []SpawnParams) ([]arbortype.Task, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	cps, err := r.spawnParams(ctx, ps)
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(cps, core.CreateParams.HasBudgets) {
		kids, err := write(ctx, r, func(ctx context.Context, tx pgx.Tx) ([]arbortype.Task, error) {
			kids, created, err := r.core.CreateMany(ctx, tx, cps)
			if err == nil {
				err = r.core.ApplyCreateBudgets(ctx, tx, cps, kids, created)
			}
			return kids, err
		})
		r.over(err)
		return kids, err
	}
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	res := r.sink.apply(ctx, r, core.Outcome{Kind: core.OutSpawn, TaskID: r.id, Token: r.token,
		ConversationID: r.conv, Spawns: cps})
	leave()
	r.over(res.Err)
	if res.Err != nil {
		return nil, res.Err
	}
	return res.Children, nil
}

// spawnParams turns a handler's spawns into the engine's creates, with keys
// of the run's own where the handler gave none.
func (r *Run) spawnParams(ctx context.Context, ps []SpawnParams) ([]core.CreateParams, error) {
	cps := make([]core.CreateParams, len(ps))
	trace := r.core.Trace(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, p := range ps {
		if p.IdempotencyKey == "" {
			r.spawns++
			p.IdempotencyKey = fmt.Sprintf("arbor:run-%d-spawn-%d", r.token, r.spawns)
		} else if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
			return nil, fmt.Errorf("spawn under task %d: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w",
				r.id, p.IdempotencyKey, tasks.ErrInvalidArgument)
		}
		cps[i] = core.CreateParams{CreateParams: p.create(r.conv, r.id), OwnerToken: r.token, Trace: trace}
	}
	return cps, nil
}

// create is the create of a child of task owner in conversation conv that
// p describes. Every field of SpawnParams is carried (TestSpawnParamsCarried
// fails on one that is not).
func (p SpawnParams) create(conv string, owner int64) arbortype.CreateParams {
	return arbortype.CreateParams{
		ConversationID: conv, OwnerID: owner,
		Kind: p.Kind, Input: p.Input, Background: p.Background, AbandonOnRestart: p.AbandonOnRestart,
		RestartLimit: p.RestartLimit, MaxRetries: p.MaxRetries, IdempotencyKey: p.IdempotencyKey,
		RetryBackoffBase: p.RetryBackoffBase, RetryBackoffCap: p.RetryBackoffCap, Deadline: p.Deadline,
		Budgets: p.Budgets,
	}
}

// Children reads every child of the task, with its status, result and error.
func (r *Run) Children(ctx context.Context) ([]arbortype.Task, error) {
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.Children(ctx, db, r.id) })
}

// Waited reads the children of the task's last wait, in id order: after the
// wait woke the task, their outcomes.
func (r *Run) Waited(ctx context.Context) ([]arbortype.Task, error) {
	if len(r.waitIDs) == 0 {
		return nil, nil
	}
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.GetMany(ctx, db, r.waitIDs) })
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
