package machine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// execute runs the handler and ends its run for it when it did not: nil
// completes the task with no result, an error of the handler's fails it,
// and an error that says the run is over (or a context cut by a stop, a
// shutdown or a lost lease) writes nothing.
//
// An error of the infrastructure's — the database unavailable past the
// engine's retry budget, or a commit whose outcome stayed unknown — is not
// the handler's failure (docs/design.md §3.8, "The ending"):
//   - an ending write the handler sent and a fault cut off is written
//     again by the runner, from the outcome sent, until it lands or the run
//     is over; the handler is not called again for it;
//   - a handler that returned a fault without having sent its end is
//     called again, once the database is back and if the task is still this
//     run's (same run, same token, from its last checkpoint; its spawns
//     without keys of their own return the children the last call made) —
//     except a handler of an abandon_on_restart kind, which is entered once:
//     its task is settled as a crash would settle it (abandoned), fenced by
//     the run's token.
//
// A task fails only for the handler's own error.
func (r *Runner) execute(ctx context.Context, run *Run) {
	t := run.Task
	log := r.logger.With(slog.String("conversation_id", t.ConversationID), slog.Int64("task_id", t.ID),
		slog.String("kind", t.Kind), slog.Int("attempt", t.Attempt))
	for try := 0; ; try++ {
		run.mu.Lock()
		run.spawns, run.ending, run.inHandler = 0, false, true
		run.mu.Unlock()
		err := callHandler(ctx, r.handlers[t.Kind], run)
		run.mu.Lock()
		run.inHandler = false
		run.mu.Unlock()
		run.handlerErr = err
		if run.Ended() && run.endedInTxForm() && !stopped(ctx) {
			confirmTxEnding(ctx, r.core, run)
			return
		}
		if run.Ended() || runOver(err) || stopped(ctx) {
			return
		}
		if o := run.takeCutOff(); o != nil && (err == nil || infrastructure(err)) {
			r.resend(ctx, run, *o, log)
			return
		}
		if infrastructure(err) && t.AbandonOnRestart {
			log.Warn("arbor: the handler of an abandon_on_restart task was cut off from the database before it sent its end; the task is abandoned, not run again",
				slog.String("error", err.Error()))
			r.abandonRun(ctx, run, log)
			return
		}
		if infrastructure(err) {
			log.Warn("arbor: the handler was cut off from the database; it runs again when the database is back",
				slog.String("error", err.Error()))
			if !r.stillOurs(ctx, run, try) {
				return
			}
			r.retake(run)
			continue
		}
		r.endFor(ctx, run, err, log)
		return
	}
}

// endFor writes the end of a run its handler left open: complete for a nil
// return, fail for an error. A write cut off from the database is tried
// again until it lands, the run is over, or the runner stops (then the
// release, or the next holder, recovers the task).
func (r *Runner) endFor(ctx context.Context, run *Run, handlerErr error, log *slog.Logger) {
	// The handler returned: its context may be cancelled (ErrBlocked, or a
	// context of the handler's own), and the runner's write of its end is
	// the runner's, not the handler's. A run stopped outright (the task
	// taken from it, the lease unconfirmed, a shutdown) is never ended here:
	// see execute.
	ctx = context.WithoutCancel(ctx)
	for try := 0; ; try++ {
		var err error
		if handlerErr == nil {
			err = run.Complete(ctx, nil)
		} else {
			err = run.fail(ctx, handlerErr)
		}
		switch {
		case err == nil || runOver(err) || run.Ended():
			return
		case infrastructure(err) && r.stillOurs(ctx, run, try):
			continue
		case infrastructure(err):
			return
		}
		log.Warn("arbor: ending the run failed", slog.String("error", err.Error()),
			slog.Any("handler_error", handlerErr))
		return
	}
}

// resend writes again an ending write of the run's that a fault cut off,
// until it lands, the run is over, or the runner stops (then the release,
// or the next holder, recovers the task).
func (r *Runner) resend(ctx context.Context, run *Run, o core.Outcome, log *slog.Logger) {
	wctx := context.WithoutCancel(ctx)
	for try := 0; ; try++ {
		if !r.stillOurs(ctx, run, try) {
			return
		}
		err := run.send(wctx, o)
		switch {
		case err == nil || runOver(err) || run.Ended():
			return
		case infrastructure(err):
			run.takeCutOff()
			continue
		}
		log.Warn("arbor: writing again the end a fault cut off failed", slog.String("error", err.Error()))
		return
	}
}

// abandonRun settles the task of an abandon_on_restart run whose handler
// returned a fault without having sent its end, as recovery would after a
// crash: its handler is never entered again. Fenced by the run's token; a
// write cut off is tried again until it lands, the run is over, or the
// runner stops (then the release abandons it the same way).
func (r *Runner) abandonRun(ctx context.Context, run *Run, log *slog.Logger) {
	wctx := context.WithoutCancel(ctx)
	for try := 0; ; try++ {
		if !r.stillOurs(ctx, run, try) {
			return
		}
		_, err := core.Tx(wctx, r.core, func(tx pgx.Tx) (bool, error) {
			return r.core.AbandonRun(wctx, tx, run.id, run.token)
		})
		switch {
		case err == nil || runOver(err):
			run.mu.Lock()
			run.ended = true
			run.mu.Unlock()
			r.core.AnnounceLog(run.conv)
			r.markDirty(run.conv) // its owner may be runnable now
			return
		case infrastructure(err):
			continue
		}
		log.Warn("arbor: abandoning the task failed", slog.String("error", err.Error()))
		return
	}
}

// stillOurs waits out a database fault and reports whether the run still
// holds its task: false when the runner stops first, or when the task was
// taken from the run meanwhile.
func (r *Runner) stillOurs(ctx context.Context, run *Run, try int) bool {
	for ; ; try++ {
		if !sleepCtx(r.runCtx, faultWait(try)) {
			return false
		}
		cur, err := core.Read(r.runCtx, r.core, func(db store.DB) (arbortype.Task, error) {
			return r.core.Get(r.runCtx, db, run.id)
		})
		if err == nil {
			return cur.Status == arbortype.StatusRunning && cur.Token == run.token && !stopped(ctx)
		}
		if r.runCtx.Err() != nil {
			return false
		}
	}
}

// stopped reports whether the handler's context was cut by the task being
// taken from the run, a shutdown or a lost lease: nothing is written then
// (the task is the next holder's, or this release's, to recover).
func stopped(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return cause != nil && (errors.Is(cause, ErrTaskStopped) || errors.Is(cause, ErrShutdown) || errors.Is(cause, arbortype.ErrLeaseLost))
}

// infrastructure reports whether err is arbor's own word that the database
// could not be used, rather than the handler's failure.
func infrastructure(err error) bool {
	return errors.Is(err, arbortype.ErrUnavailable) || errors.Is(err, arbortype.ErrAmbiguous)
}

// faultWait is the pause before the try'th look at the database after a
// fault: 50 ms doubling to at most 2 s.
func faultWait(try int) time.Duration {
	if try >= 6 {
		return 2 * time.Second
	}
	return 50 * time.Millisecond << try
}

// sleepCtx waits for d, or until ctx ends; it reports whether it waited.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
