package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// maintainer is the runner's maintenance service. It does two kinds of
// work:
//
//   - the runner's own, on every runner: each PollInterval, while the
//     runner's unresolved flag is set, it adopts the runs a commit whose
//     answer was lost may have claimed; and every audit interval, the
//     runner's audit of what it holds against the database (audit.go);
//   - the schema's, on one runner only, the maintenance leader (leader.go):
//     each PollInterval it fires the schedules due (schedule.go), fails
//     the live tasks past their deadline (their
//     foreground subtrees aborted) and those over a "fail" wall-time
//     budget; less often, the never-started tasks of kinds it has no
//     handler for that no runner claimed within UnknownKindGrace, the
//     reservations whose run is over, and the holder rows of lives long
//     over. (The prune is a periodic River job, which River's own leader
//     inserts: pruneworker.go.)
//
// It holds no state of the runner's: it reads and writes the database
// only, and reaches the runner through what it is given (unresolved,
// adopt, audit, and the node's lease, which it reads), so it takes no lock
// of the runner's but adopt's and the audit's own.
type maintainer struct {
	core   *core.Engine
	logger *slog.Logger
	kinds  []string      // the kinds the runner has handlers for
	poll   time.Duration // RunnerConfig.PollInterval
	grace  time.Duration // RunnerConfig.UnknownKindGrace
	// unresolved is the runner's flag (Runner.unresolved); adopt, the
	// runner's adoption of what the node holds (Runner.adopt).
	unresolved *atomic.Bool
	adopt      func(ctx context.Context)
	// audit is the runner's audit of what it holds (Runner.audit), every
	// auditEvery.
	audit      func(ctx context.Context)
	auditEvery time.Duration
	// lease is the node's lease: the leadership is its holder row's.
	lease *nodeLease
	// leading is whether the last look found this runner the leader (for
	// the log of a change).
	leading bool
	// scanned, set by a test before Start (Runner.testMaintained), is
	// called at the end of each PollInterval's tick with whether this
	// runner led it (ran the schema's scans). Nil outside tests.
	scanned func(led bool)
}

func newMaintainer(r *Runner) *maintainer {
	return &maintainer{
		core:       r.core,
		logger:     r.logger,
		kinds:      r.kinds,
		poll:       r.cfg.PollInterval,
		grace:      r.cfg.UnknownKindGrace,
		unresolved: &r.unresolved,
		adopt:      func(ctx context.Context) { r.adopt(ctx, nil) },
		audit:      r.audit,
		auditEvery: r.auditInterval(),
		lease:      r.lease,
		scanned:    r.testMaintained,
	}
}

// run does the maintenance until ctx ends.
func (m *maintainer) run(ctx context.Context) {
	interval := min(m.grace/4, time.Minute)
	if interval <= 0 {
		interval = time.Minute
	}
	slow := time.NewTicker(interval)
	defer slow.Stop()
	fast := time.NewTicker(m.poll)
	defer fast.Stop()
	audit := time.NewTicker(m.auditEvery)
	defer audit.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-fast.C:
			if m.unresolved.Swap(false) {
				m.adopt(ctx)
			}
			lctx, cancel, led := m.lead(ctx)
			if led {
				m.fireSchedules(lctx)
				m.expireDeadlines(lctx)
				m.expireWallTime(lctx)
				m.expireQueued(lctx)
				cancel()
			}
			if m.scanned != nil && ctx.Err() == nil {
				m.scanned(led)
			}
		case <-audit.C:
			m.audit(ctx)
		case <-slow.C:
			if lctx, cancel, led := m.lead(ctx); led {
				m.failUnknownKinds(lctx)
				m.sweepLapsedReservations(lctx)
				m.pruneHolders(lctx)
				cancel()
			}
		}
	}
}

// expireDeadlines fails the live tasks past their deadline.
func (m *maintainer) expireDeadlines(ctx context.Context) {
	ids, err := core.Read(ctx, m.core, func(db store.DB) ([]int64, error) { return m.core.LiveDeadlines(ctx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(ctx, m.core, func(tx pgx.Tx) (bool, error) { return m.core.Expire(ctx, tx, id) })
		if err != nil && !errors.Is(err, arbortype.ErrInvalidTransition) && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "arbor: failing a task past its deadline failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// expireQueued cancels the tasks that did not start within their time to
// live in the queue (code CodeExpired).
func (m *maintainer) expireQueued(ctx context.Context) {
	if _, err := m.core.ExpireQueued(ctx, 100); err != nil && ctx.Err() == nil {
		m.logger.WarnContext(ctx, "arbor: cancelling tasks expired in their queue failed", slog.String("error", err.Error()))
	}
}

// expireWallTime fails the live tasks under a "fail" wall-time budget
// that is over (arbortype.CounterWallTime).
func (m *maintainer) expireWallTime(ctx context.Context) {
	ids, err := core.Read(ctx, m.core, func(db store.DB) ([]int64, error) { return m.core.OverWallTime(ctx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(ctx, m.core, func(tx pgx.Tx) (bool, error) { return m.core.ExpireWallTime(ctx, tx, id) })
		if err != nil && !errors.Is(err, arbortype.ErrInvalidTransition) && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "arbor: failing a task over its wall-time budget failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// sweepLapsedReservations spends in full the reservations whose run is
// over (a crash between reserve and record), so that budgets read right
// without waiting for the next reservation of the counter, which would
// sweep them too.
func (m *maintainer) sweepLapsedReservations(ctx context.Context) {
	pairs, err := core.Read(ctx, m.core, func(db store.DB) ([]store.ConversationCounter, error) {
		return m.core.LapsedReservations(ctx, db, 100)
	})
	if err != nil {
		return
	}
	for _, p := range pairs {
		_, err := core.Tx(ctx, m.core, func(tx pgx.Tx) (struct{}, error) {
			return struct{}{}, m.core.SweepLapsed(ctx, tx, p.ConversationID, p.Counter)
		})
		if err != nil && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "arbor: spending lapsed reservations failed", slog.String("conversation_id", p.ConversationID),
				slog.String("counter", p.Counter), slog.String("error", err.Error()))
		}
	}
}

func (m *maintainer) failUnknownKinds(ctx context.Context) {
	ids, err := m.core.Store.StaleUnknownKinds(ctx, m.core.Pool, m.kinds, m.grace, 100)
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(ctx, m.core, func(tx pgx.Tx) (arbortype.Task, error) {
			return m.core.ForceFail(ctx, tx, id, arbortype.TaskError{Code: arbortype.CodeUnknownKind,
				Message: fmt.Sprintf("no runner had a handler for its kind within %s", m.grace)})
		})
		if err != nil && !errors.Is(err, arbortype.ErrInvalidTransition) && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "arbor: failing a task of unknown kind failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// holderRowsKept is how long a holder row that expired and holds nothing
// is kept before the maintenance removes it (for operators reading it).
const holderRowsKept = time.Hour

// pruneHolders removes holder rows of lives long over.
func (m *maintainer) pruneHolders(ctx context.Context) {
	_, err := core.Read(ctx, m.core, func(db store.DB) (int64, error) {
		return m.core.PruneHolders(ctx, db, holderRowsKept, 1000)
	})
	if err != nil && ctx.Err() == nil {
		m.logger.Debug("arbor: removing old holder rows failed", slog.String("error", err.Error()))
	}
}
