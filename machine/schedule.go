package machine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// Firing the schedules (docs/design.md §3.16), the maintenance leader's
// work each PollInterval. Each batch is one transaction (core's
// FireSchedules): the due rows locked, their turns created, their next
// ticks moved, committed together; a leader deposed mid-batch, or a second
// one, finds the rows locked or no longer due, so a tick fires once.

// scheduleBatch bounds the schedules fired in one transaction, and
// scheduleBatches the transactions of one tick of the maintenance: the
// rest wait for the next.
const (
	scheduleBatch   = 100
	scheduleBatches = 10
)

// scheduleGrace is how late a tick may be fired and still count as on
// time for a schedule that skips missed ticks: a minute, or two
// PollIntervals if longer (a leader's failover takes up to a lease and a
// PollInterval).
func (m *maintainer) scheduleGrace() time.Duration { return max(time.Minute, 2*m.poll) }

// fireSchedules fires the due schedules. A read first says whether any
// is due: most polls find none, and cost one probe of an index, not a
// transaction.
func (m *maintainer) fireSchedules(ctx context.Context) {
	due, err := core.Read(ctx, m.core, func(db store.DB) (bool, error) { return m.core.Store.AnyScheduleDue(ctx, db) })
	if err != nil || !due {
		return
	}
	for range scheduleBatches {
		fired, err := core.Tx(ctx, m.core, func(tx pgx.Tx) ([]core.ScheduleFired, error) {
			return m.core.FireSchedules(ctx, tx, m.scheduleGrace(), scheduleBatch)
		})
		if err != nil {
			if ctx.Err() == nil {
				m.logger.WarnContext(ctx, "arbor: firing schedules failed; trying again at the next tick", slog.String("error", err.Error()))
			}
			return
		}
		for _, f := range fired {
			if f.Err != nil {
				m.logger.WarnContext(ctx, "arbor: a schedule's tick started no turn", slog.String("schedule", f.Name),
					slog.Time("tick", f.Tick), slog.String("error", f.Err.Error()))
			}
		}
		if len(fired) < scheduleBatch {
			return
		}
	}
}
