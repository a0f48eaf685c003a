package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The web view's operator reads (store/queries/inspect_ops.sql): read
// only, no lock, each bounded.

// ConversationState is what tells, in one conversation, a turn queued
// behind a live one from work that is stuck.
type ConversationState struct {
	ID string
	// Now is the database's clock at the read.
	Now time.Time
	// FirstLiveRoot is its oldest live turn (0: none).
	FirstLiveRoot int64
	// Queued counts its pending turns behind FirstLiveRoot; Overdue its
	// running tasks past their task lease (each up to the read's bound).
	Queued, Overdue int
	// StalePending: a pending task that is not a queued turn was created
	// longer ago than the read's threshold.
	StalePending bool
}

var qConversationStates = define("ConversationStates")

// ConversationStates reads the states of the conversations ids, counting
// at most limit rows of each count; stale is the age past which a pending
// task is StalePending.
func (s *Store) ConversationStates(ctx context.Context, db DB, ids []string, stale time.Duration, limit int) ([]ConversationState, error) {
	rows, err := db.Query(ctx, s.sql[qConversationStates], ids, stale.Microseconds(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConversationState, error) {
		var c ConversationState
		err := row.Scan(&c.ID, &c.Now, &c.FirstLiveRoot, &c.Queued, &c.Overdue, &c.StalePending)
		return c, err
	})
}

var qNewestRootID = define("NewestRootID")

// NewestRootID reads the id of conv's newest root task; ErrNoRows when it
// has none.
func (s *Store) NewestRootID(ctx context.Context, db DB, conv string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, s.sql[qNewestRootID], conv).Scan(&id)
	return id, err
}

var qLiveRootIDs = define("LiveRootIDs")

// LiveRootIDs reads up to limit live root tasks of conv, the oldest first.
func (s *Store) LiveRootIDs(ctx context.Context, db DB, conv string, limit int) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql[qLiveRootIDs], conv, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// AwaitContext is the checkpoint state a handler saved with its await,
// cut (State) and its whole length in characters (Length).
type AwaitContext struct {
	TaskID int64
	State  string
	Length int
}

var qAwaitContexts = define("AwaitContexts")

// AwaitContexts reads the states of the tasks ids, each cut to max
// characters.
func (s *Store) AwaitContexts(ctx context.Context, db DB, ids []int64, max int) ([]AwaitContext, error) {
	rows, err := db.Query(ctx, s.sql[qAwaitContexts], ids, max)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (AwaitContext, error) {
		var a AwaitContext
		err := row.Scan(&a.TaskID, &a.State, &a.Length)
		return a, err
	})
}

// TurnMinute is one tenant's turns in one minute: started, settled and,
// of those settled, failed.
type TurnMinute struct {
	Tenant                   string
	Minute                   time.Time
	Started, Settled, Failed int
}

var (
	qSettledTurnsPerMinute = define("SettledTurnsPerMinute")
	qStartedTurnsPerMinute = define("StartedTurnsPerMinute")
)

// SettledTurnsPerMinute counts the turns settled (and failed) per tenant
// and minute over the last window, reading at most scan of them.
func (s *Store) SettledTurnsPerMinute(ctx context.Context, db DB, window time.Duration, scan int) ([]TurnMinute, error) {
	rows, err := db.Query(ctx, s.sql[qSettledTurnsPerMinute], window.Microseconds(), scan)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TurnMinute, error) {
		var m TurnMinute
		err := row.Scan(&m.Tenant, &m.Minute, &m.Settled, &m.Failed)
		return m, err
	})
}

// StartedTurnsPerMinute counts the turns started per tenant and minute
// over the last window among the newest scan tasks, how many tasks it
// read, and the database's clock.
func (s *Store) StartedTurnsPerMinute(ctx context.Context, db DB, window time.Duration, scan int) ([]TurnMinute, int, time.Time, error) {
	var now time.Time
	rows, err := db.Query(ctx, s.sql[qStartedTurnsPerMinute], window.Microseconds(), scan)
	if err != nil {
		return nil, 0, now, err
	}
	var (
		out     []TurnMinute
		scanned int
		tenant  *string
		minute  *time.Time
		started *int
	)
	_, err = pgx.ForEachRow(rows, []any{&scanned, &now, &tenant, &minute, &started}, func() error {
		if tenant != nil {
			out = append(out, TurnMinute{Tenant: *tenant, Minute: *minute, Started: *started})
		}
		return nil
	})
	return out, scanned, now, err
}

// TenantPending is one tenant's pending tasks: how many (up to the read's
// bound), and when the head of its queue was created (Oldest), by the
// database's clock (Now).
type TenantPending struct {
	Tenant      string
	N           int
	Oldest, Now time.Time
}

var qPendingByTenant = define("PendingByTenant")

// PendingByTenant reads the pending depth of up to tenants tenants, each
// counted up to limit, with the creation time of the head of its queue.
func (s *Store) PendingByTenant(ctx context.Context, db DB, tenants, limit int) ([]TenantPending, error) {
	rows, err := db.Query(ctx, s.sql[qPendingByTenant], tenants, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TenantPending, error) {
		var p TenantPending
		var oldest *time.Time
		err := row.Scan(&p.Tenant, &p.N, &oldest, &p.Now)
		if oldest != nil {
			p.Oldest = *oldest
		}
		return p, err
	})
}
