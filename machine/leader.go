package machine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// The maintenance leader. The schema-wide scans of the maintenance
// (maintainer) run on one runner per schema: the one whose holder row the
// schema's maintenance_leader row names, while that row is live (migration
// 002). The leadership is a life's: its lease is the node's lease, renewed
// by the renewer with everything the node holds, and it ends when the
// holder row expires (a runner killed, frozen or cut off from the
// database), or is removed (Stop). Each runner looks at every tick of its
// maintenance: one read, no lock, while a leader is live; when none is,
// an election in one short transaction, which the first runner to lock
// the row wins (internal/store's ElectLeader). So when the leader dies,
// another runner leads within a lease and a PollInterval.
//
// A leader acts only while its lease is usable (the fence has not fired:
// the holder row cannot have expired in the database, clocks allowing),
// and each scan it begins runs under a context that ends at the fence
// point, so a leader that lost its lease stops writing before another can
// have been elected. What a deposed leader may still commit is harmless by
// construction: each of the scans' writes is its own transaction that
// checks what it changes (a task past its deadline and still live, a
// reservation whose run is over, a holder row long expired), as when every
// runner ran every scan; a second leader's scan of the same rows finds
// nothing to do.

// lead reports whether this runner leads the schema's maintenance now,
// electing it when no live holder leads. When it does, the returned
// context, which the caller cancels, ends at the lease's fence point.
func (m *maintainer) lead(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	until, ok := m.lease.usableUntil(time.Now())
	if !ok {
		m.follow()
		return nil, nil, false
	}
	id, _ := m.lease.holder()
	lctx, cancel := context.WithDeadline(ctx, until)
	type look struct {
		leader int64
		live   bool
	}
	got, err := core.Read(lctx, m.core, func(db store.DB) (look, error) {
		leader, live, err := m.core.Store.Leader(lctx, db)
		return look{leader, live}, err
	})
	led := err == nil && got.live && got.leader == id
	if err == nil && !got.live {
		led, err = core.Tx(lctx, m.core, func(tx pgx.Tx) (bool, error) { return m.core.Store.ElectLeader(lctx, tx, id) })
	}
	if err != nil {
		// Not known either way: this tick is skipped, the next looks again.
		cancel()
		if ctx.Err() == nil {
			m.logger.Debug("arbor: looking for the maintenance leader failed; trying again at the next tick", slog.String("error", err.Error()))
		}
		return nil, nil, false
	}
	if !led {
		cancel()
		m.follow()
		return nil, nil, false
	}
	if !m.leading {
		m.leading = true
		m.logger.Info("arbor: this runner leads the schema's maintenance", slog.Int64("holder_id", id))
	}
	return lctx, cancel, true
}

// follow notes that this runner does not lead (any more).
func (m *maintainer) follow() {
	if m.leading {
		m.leading = false
		m.logger.Info("arbor: this runner no longer leads the schema's maintenance")
	}
}
