package machine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
)

// maintenanceLoop adopts, each PollInterval while Runner.unresolved is
// set, the runs a commit whose answer was lost may have claimed; fails,
// each PollInterval, the live tasks past their
// deadline (their foreground subtrees aborted) and those over a "fail"
// wall-time budget; and, less often, the never-started tasks of kinds no
// runner claimed within UnknownKindGrace, the reservations whose run is
// over, and the holder rows of lives long over (the prune is a periodic
// River job: pruneworker.go). Every runner does it; the engine's
// transactions make a second runner's attempt a no-op.
func (r *Runner) maintenanceLoop() {
	defer r.loops.Done()
	interval := min(r.cfg.UnknownKindGrace/4, time.Minute)
	if interval <= 0 {
		interval = time.Minute
	}
	slow := time.NewTicker(interval)
	defer slow.Stop()
	fast := time.NewTicker(r.cfg.PollInterval)
	defer fast.Stop()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-fast.C:
			if r.unresolved.Swap(false) {
				r.adopt(r.runCtx, nil)
			}
			r.expireDeadlines()
			r.expireWallTime()
		case <-slow.C:
			r.failUnknownKinds()
			r.sweepLapsedReservations()
			r.pruneHolders()
		}
	}
}

// expireDeadlines fails the live tasks past their deadline.
func (r *Runner) expireDeadlines() {
	ids, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]int64, error) { return r.core.LiveDeadlines(r.runCtx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (bool, error) { return r.core.Expire(r.runCtx, tx, id) })
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task past its deadline failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// expireWallTime fails the live tasks under a "fail" wall-time budget
// that is over (arbortype.CounterWallTime).
func (r *Runner) expireWallTime() {
	ids, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]int64, error) { return r.core.OverWallTime(r.runCtx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (bool, error) { return r.core.ExpireWallTime(r.runCtx, tx, id) })
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task over its wall-time budget failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// sweepLapsedReservations spends in full the reservations whose run is
// over (a crash between reserve and record), so that budgets read right
// without waiting for the next reservation of the counter, which would
// sweep them too.
func (r *Runner) sweepLapsedReservations() {
	pairs, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]store.ConversationCounter, error) {
		return r.core.LapsedReservations(r.runCtx, db, 100)
	})
	if err != nil {
		return
	}
	for _, p := range pairs {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (struct{}, error) {
			return struct{}{}, r.core.SweepLapsed(r.runCtx, tx, p.ConversationID, p.Counter)
		})
		if err != nil && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: spending lapsed reservations failed", slog.String("conversation_id", p.ConversationID),
				slog.String("counter", p.Counter), slog.String("error", err.Error()))
		}
	}
}

func (r *Runner) failUnknownKinds() {
	ids, err := r.core.Store.StaleUnknownKinds(r.runCtx, r.core.Pool, r.kinds, r.cfg.UnknownKindGrace, 100)
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (arbortype.Task, error) {
			return r.core.ForceFail(r.runCtx, tx, id, arbortype.TaskError{Code: arbortype.CodeUnknownKind,
				Message: fmt.Sprintf("no runner had a handler for its kind within %s", r.cfg.UnknownKindGrace)})
		})
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task of unknown kind failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// holderRowsKept is how long a holder row that expired and holds nothing
// is kept before the maintenance removes it (for operators reading it).
const holderRowsKept = time.Hour

// pruneHolders removes holder rows of lives long over.
func (r *Runner) pruneHolders() {
	_, err := core.Read(r.runCtx, r.core, func(db store.DB) (int64, error) {
		return r.core.PruneHolders(r.runCtx, db, holderRowsKept, 1000)
	})
	if err != nil && r.runCtx.Err() == nil {
		r.logger.Debug("arbor: removing old holder rows failed", slog.String("error", err.Error()))
	}
}
