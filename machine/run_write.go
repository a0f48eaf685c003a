package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// How a run's calls reach the database: entered and left (the handler's
// time against arbor's), written under a context of their own, ended once,
// applied by the runner's completer or, outside a Runner, directly.

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
// returns its result. When ctx is cancelled first, the run is over, and fn
// goes on to its end (under writeCtx, bounded), so that a write already
// committing is not cut into an unknown outcome; its caller is told at once
// ErrAmbiguous (fn's result, if it is in already) — never a refusal while
// the write may still land.
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
		if err != nil && wctx.Err() != nil && ctx.Err() == nil && !core.IsArborError(err) {
			// The write's own bound (writeTimeout) ended it, not its
			// caller: a fault (a row held past it, say), not the handler's
			// failure. A commit whose outcome is unknown is ErrAmbiguous
			// already, so nothing was written.
			err = fmt.Errorf("%w: the write did not land within %s: %w", arbortype.ErrUnavailable, writeTimeout, err)
		}
		done <- result{v, err}
	}()
	select {
	case res := <-done:
		return res.v, res.err
	case <-ctx.Done():
	}
	stopped := r.stoppedErr(ctx)
	select {
	case res := <-done:
		return res.v, res.err
	default:
		var zero T
		return zero, fmt.Errorf("%v, while its write was being committed: %w", stopped, arbortype.ErrAmbiguous)
	}
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
	return errors.Is(err, arbortype.ErrLeaseLost) || errors.Is(err, arbortype.ErrAborted) || errors.Is(err, arbortype.ErrNotRunning)
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
			if !errors.Is(err, arbortype.ErrAmbiguous) || wctx.Err() != nil {
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
	return r.send(ctx, o)
}

// send applies o, a filled-in ending write of the run, and notes what came
// of it.
func (r *Run) send(ctx context.Context, o core.Outcome) error {
	res := r.sink.apply(ctx, r, o)
	r.end(res.Err)
	r.record(o, res, r.handlerErr)
	r.mu.Lock()
	if infrastructure(res.Err) {
		r.cutOff = &o
	} else {
		r.cutOff = nil
	}
	r.mu.Unlock()
	return res.Err
}

// takeCutOff returns the run's ending write that a fault cut off, if any,
// and forgets it.
func (r *Run) takeCutOff() *core.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.cutOff
	r.cutOff = nil
	return o
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
		if !errors.Is(err, arbortype.ErrAmbiguous) || ctx.Err() != nil {
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
		return false, fmt.Errorf("%w (reading the task back to resolve it failed: %w)", arbortype.ErrAmbiguous, err)
	}
	return !(cur.Status == arbortype.StatusRunning && cur.Token == o.Token), nil
}

// endedBy is what a resolved ending write returns: nil, or ErrAborted for a
// task that was aborted meanwhile.
func endedBy(ctx context.Context, c *core.Engine, o core.Outcome) error {
	cur, err := core.Read(ctx, c, func(db store.DB) (arbortype.Task, error) { return c.Get(ctx, db, o.TaskID) })
	if err == nil && cur.Status == arbortype.StatusAborted {
		return fmt.Errorf("task %d: %w", o.TaskID, arbortype.ErrAborted)
	}
	return nil
}
