package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	qConversationIDs     = define("ConversationIDs")
	qDuplicateLiveTokens = define("DuplicateLiveTokens")

	// What the checker reads of the rows beside the tasks (docs/design.md
	// §4, invariants 8, 11 and 12): rows a guard refuses to write, which
	// only a write with the triggers off (or a bug of the guard) leaves.

	qCheckHolder      = define("CheckHolder")
	qForgedDeliveries = define("ForgedDeliveries")
	qLiveForks        = define("LiveForks")
	qAllEvents        = define("AllEvents")
	qLogByTask        = define("LogByTask")
	qOrphanRows       = define("OrphanRows")
	qFutureLog        = define("FutureLog")
	qForgedLogEvents  = define("ForgedLogEvents")
	qForgedProgress   = define("ForgedProgress")
	qLoggedEvents     = define("LoggedEvents")

	qCheckTenantBudgets = define("CheckTenantBudgets")
)

// TenantBudgetSums is a tenant budget with the sums of the reservations
// that charged it: Open of the open ones, Closed of the closed ones its
// Spent still counts (its current window's, or all without a window).
type TenantBudgetSums struct {
	ID                      int64
	Tenant, Counter, Window string
	Spent, Reserved         int64
	Open, Closed            int64
}

// CheckTenantBudgets reads up to limit tenant budgets with the sums of
// their reservations.
func (s *Store) CheckTenantBudgets(ctx context.Context, db DB, limit int) ([]TenantBudgetSums, error) {
	rows, err := db.Query(ctx, s.sql[qCheckTenantBudgets], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TenantBudgetSums, error) {
		var b TenantBudgetSums
		err := row.Scan(&b.ID, &b.Tenant, &b.Counter, &b.Window, &b.Spent, &b.Reserved, &b.Open, &b.Closed)
		return b, err
	})
}

// ConversationIDs lists every conversation, in id order.
func (s *Store) ConversationIDs(ctx context.Context, db DB) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qConversationIDs]))
}

// DuplicateTokens lists fencing tokens held by more than one task of a
// conversation (there must be none).
func (s *Store) DuplicateTokens(ctx context.Context, db DB, conversationID string) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qDuplicateLiveTokens], conversationID))
}

// Records is what the invariant checker reads of a conversation's rows
// beside its tasks: the records a forged write (with the triggers off)
// can leave inconsistent.
type Records struct {
	// Holder and HolderID are the conversation row's; HolderRow is the
	// name of the holders row HolderID names (nil: there is none).
	Holder    string
	HolderID  int64
	HolderRow *string
	// HolderExpires is that row's deadline (nil: there is no row).
	HolderExpires *time.Time
	// Now is the database's clock; Created the conversation's birth.
	Now, Created time.Time
	// FutureLog are log entries (seq) stamped after Now by more than the
	// slack CheckRecords was given (at most ten).
	FutureLog []int64
	// ForgedDeliveries are tasks whose delivered names no event delivered
	// to them as emitted; LiveForks live tasks marked as a fork's copies.
	ForgedDeliveries, LiveForks []int64
	// Events are the conversation's events, ascending.
	Events []Event
	// LoggedEvents are the event ids the conversation's log has an emit
	// entry for.
	LoggedEvents []int64
	// ForgedLogEvents are event entries of the log (seq) that no emit
	// wrote (at most ten).
	ForgedLogEvents []int64
	// ForgedProgress are progress entries of the log (seq) that no run
	// wrote (at most ten), among those of tasks created at or after the
	// kept time CheckRecords was given.
	ForgedProgress []int64
	// Logged is, per task id the log names, what it says of the task.
	Logged []TaskLog
}

// TaskLog is what a conversation's log says of one task.
type TaskLog struct {
	TaskID int64
	// Status is the newest status entry's status ("" if it has none).
	Status string
	// Awaited are the event names the task was logged parked awaiting.
	Awaited []string
}

// CheckRecords reads the conversation's Records (in the caller's
// snapshot); slack is how far past the database's clock a log entry's time
// may be, and kept how old a task may be for the log to keep all of its
// entries (the log's retention before the database's clock).
func (s *Store) CheckRecords(ctx context.Context, db DB, conv string, slack, retention time.Duration) (Records, error) {
	var r Records
	if err := db.QueryRow(ctx, s.sql[qCheckHolder], conv).Scan(&r.Holder, &r.HolderID, &r.HolderRow, &r.HolderExpires, &r.Now, &r.Created); err != nil {
		return Records{}, err
	}
	var err error
	if r.FutureLog, err = collect[int64](db.Query(ctx, s.sql[qFutureLog], conv, slack.Microseconds())); err != nil {
		return Records{}, err
	}
	if r.ForgedDeliveries, err = collect[int64](db.Query(ctx, s.sql[qForgedDeliveries], conv)); err != nil {
		return Records{}, err
	}
	if r.LiveForks, err = collect[int64](db.Query(ctx, s.sql[qLiveForks], conv)); err != nil {
		return Records{}, err
	}
	rows, err := db.Query(ctx, s.sql[qAllEvents], conv)
	if err != nil {
		return Records{}, err
	}
	if r.Events, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) }); err != nil {
		return Records{}, err
	}
	if r.LoggedEvents, err = collect[int64](db.Query(ctx, s.sql[qLoggedEvents], conv)); err != nil {
		return Records{}, err
	}
	if r.ForgedLogEvents, err = collect[int64](db.Query(ctx, s.sql[qForgedLogEvents], conv)); err != nil {
		return Records{}, err
	}
	if r.ForgedProgress, err = collect[int64](db.Query(ctx, s.sql[qForgedProgress], conv, r.Now.Add(-retention))); err != nil {
		return Records{}, err
	}
	rows, err = db.Query(ctx, s.sql[qLogByTask], conv)
	if err != nil {
		return Records{}, err
	}
	r.Logged, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskLog, error) {
		var l TaskLog
		err := row.Scan(&l.TaskID, &l.Status, &l.Awaited)
		return l, err
	})
	return r, err
}

// OrphanRows counts, per table and conversation, the rows that name a
// conversation that does not exist (at most limit of them).
type OrphanRows struct {
	Table, ConversationID string
	Rows                  int64
}

// OrphanRows lists the rows of arbor's tables whose conversation does not
// exist, grouped by table and conversation, at most limit groups.
func (s *Store) OrphanRows(ctx context.Context, db DB, limit int) ([]OrphanRows, error) {
	rows, err := db.Query(ctx, s.sql[qOrphanRows], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrphanRows, error) {
		var o OrphanRows
		err := row.Scan(&o.Table, &o.ConversationID, &o.Rows)
		return o, err
	})
}
