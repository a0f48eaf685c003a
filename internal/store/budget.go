package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Budgets and their reservations (internal/core/budget.go).

// BudgetRow is a row of the budgets table. Max is arbortype.Unlimited for
// a tally (NULL in the table).
type BudgetRow struct {
	ConversationID string
	TaskID         int64 // 0: the conversation
	Counter        string
	Max            int64
	Spent          int64
	Reserved       int64
	Carried        int64
	OnExhausted    arbortype.BudgetAction
	UpdatedAt      time.Time
}

// ReservationRow is a row of budget_reservations.
type ReservationRow struct {
	ID             int64
	ConversationID string
	TaskID         int64
	Counter        string
	RunToken       int64
	IdempotencyKey string
	Amount         int64
	Actual         *int64
	Lapsed         bool
	// TenantBudgets are the tenant budgets the reservation charged (filled
	// by OpenReservations; written by InsertReservation).
	TenantBudgets []int64
	// RunOver: the run that reserved is over (its task is no longer running
	// under RunToken); filled by OpenReservations only.
	RunOver bool
}

// ScopeNode is a task of a reserving task's chain (itself and its owners
// up to the root), with when it was created.
type ScopeNode struct {
	TaskID    int64
	CreatedAt time.Time
	// Now is the database's clock when the chain was read.
	Now time.Time
}

// RunTask is what a reservation reads of the reserving task.
type RunTask struct {
	ConversationID string
	Status         arbortype.Status
	Token          int64
	Tenant         string
}

func scanBudget(row pgx.Row) (BudgetRow, error) {
	var b BudgetRow
	err := row.Scan(&b.ConversationID, &b.TaskID, &b.Counter, &b.Max, &b.Spent, &b.Reserved, &b.Carried, &b.OnExhausted, &b.UpdatedAt)
	return b, err
}

func scanReservation(row pgx.Row) (ReservationRow, error) {
	var r ReservationRow
	err := row.Scan(&r.ID, &r.ConversationID, &r.TaskID, &r.Counter, &r.RunToken, &r.IdempotencyKey, &r.Amount, &r.Actual, &r.Lapsed)
	return r, err
}

var (
	qRunTask             = define("RunTask")
	qScopeChain          = define("ScopeChain")
	qConversationCreated = define("ConversationCreated")
	qLockBudgets         = define("LockBudgets")
	qReadBudgets         = define("ReadBudgets")
	qConversationBudgets = define("ConversationBudgets")
	qInsertBudget        = define("InsertBudget")
	qUpdateBudget        = define("UpdateBudget")
	qChargeBudgets       = define("ChargeBudgets")
	qReserveAtOnce       = define("ReserveAtOnce")
	qRecordAtOnce        = define("RecordAtOnce")
	qReservationByKey    = define("ReservationByKey")
	qInsertReservation   = define("InsertReservation")
	qCloseReservation    = define("CloseReservation")
	qOpenReservations    = define("OpenReservations")
	qSpendByTask         = define("SpendByTask")
	qLapsedReservations  = define("LapsedReservations")
	qOverWallTime        = define("OverWallTime")

	qLockTenantBudgets           = define("LockTenantBudgets")
	qReadTenantBudgets           = define("ReadTenantBudgets")
	qLockTenantBudgetWriters     = define("LockTenantBudgetWriters")
	qLockTenantLiveConversations = define("LockTenantLiveConversations")
	qInsertTenantBudget          = define("InsertTenantBudget")
	qUpdateTenantBudget          = define("UpdateTenantBudget")
	qChargeTenantBudgets         = define("ChargeTenantBudgets")
	qConversationTenant          = define("ConversationTenant")
)

// RunTask share-locks the reserving task and reads what a reservation
// checks of it.
func (s *Store) RunTask(ctx context.Context, db DB, conv string, taskID int64) (RunTask, error) {
	var t RunTask
	err := db.QueryRow(ctx, s.sql[qRunTask], taskID, conv).Scan(&t.ConversationID, &t.Status, &t.Token, &t.Tenant)
	return t, err
}

// ScopeChain reads task taskID and its owners up to the root, the task
// first.
func (s *Store) ScopeChain(ctx context.Context, db DB, conv string, taskID int64) ([]ScopeNode, error) {
	rows, err := db.Query(ctx, s.sql[qScopeChain], conv, taskID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeNode, error) {
		var n ScopeNode
		err := row.Scan(&n.TaskID, &n.CreatedAt, &n.Now)
		return n, err
	})
}

// ConversationCreated reads when a conversation was created.
func (s *Store) ConversationCreated(ctx context.Context, db DB, conv string) (time.Time, error) {
	var at time.Time
	err := db.QueryRow(ctx, s.sql[qConversationCreated], conv).Scan(&at)
	return at, err
}

// LockBudgets locks every budget of conv for the counters, in the one
// order every writer uses.
func (s *Store) LockBudgets(ctx context.Context, tx pgx.Tx, conv string, counters []string) ([]BudgetRow, error) {
	return collectBudgets(tx.Query(ctx, s.sql[qLockBudgets], conv, counters))
}

// ReadBudgets reads, without locking, every budget of conv for the
// counters.
func (s *Store) ReadBudgets(ctx context.Context, db DB, conv string, counters []string) ([]BudgetRow, error) {
	return collectBudgets(db.Query(ctx, s.sql[qReadBudgets], conv, counters))
}

// ConversationBudgets reads every budget of a conversation.
func (s *Store) ConversationBudgets(ctx context.Context, db DB, conv string) ([]BudgetRow, error) {
	return collectBudgets(db.Query(ctx, s.sql[qConversationBudgets], conv))
}

// InsertBudget creates a budget counting its scope's spend so far; ok is
// false when the scope has one for the counter already.
func (s *Store) InsertBudget(ctx context.Context, tx pgx.Tx, b BudgetRow) (BudgetRow, bool, error) {
	row, err := scanBudget(tx.QueryRow(ctx, s.sql[qInsertBudget], b.ConversationID, b.TaskID, b.Counter, nullMax(b.Max), b.OnExhausted))
	if IsNoRows(err) {
		return BudgetRow{}, false, nil
	}
	return row, err == nil, err
}

// UpdateBudget sets a budget's maximum and action.
func (s *Store) UpdateBudget(ctx context.Context, tx pgx.Tx, b BudgetRow) (BudgetRow, error) {
	return scanBudget(tx.QueryRow(ctx, s.sql[qUpdateBudget], b.ConversationID, b.TaskID, b.Counter, nullMax(b.Max), b.OnExhausted))
}

// ChargeBudgets moves held from reserved to spent as spent on the scopes
// (task ids, 0 for the conversation) of one counter.
func (s *Store) ChargeBudgets(ctx context.Context, tx pgx.Tx, conv, counter string, scopes []int64, held, spent int64) error {
	_, err := tx.Exec(ctx, s.sql[qChargeBudgets], conv, counter, scopes, held, spent)
	return err
}

// ReservationByKey reads a task's reservation by its idempotency key.
func (s *Store) ReservationByKey(ctx context.Context, db DB, conv string, taskID int64, key string) (ReservationRow, error) {
	return scanReservation(db.QueryRow(ctx, s.sql[qReservationByKey], conv, taskID, key))
}

// InsertReservation records a reservation; with actual not nil it is
// closed at once (a spend).
func (s *Store) InsertReservation(ctx context.Context, tx pgx.Tx, r ReservationRow) (ReservationRow, error) {
	return scanReservation(tx.QueryRow(ctx, s.sql[qInsertReservation], r.ConversationID, r.TaskID, r.Counter, r.RunToken,
		r.IdempotencyKey, r.Amount, r.Actual, nonNilIDs(r.TenantBudgets)))
}

// CloseReservation closes an open reservation; false when it was closed.
func (s *Store) CloseReservation(ctx context.Context, tx pgx.Tx, conv string, id, actual int64, lapsed bool) (bool, error) {
	tag, err := tx.Exec(ctx, s.sql[qCloseReservation], conv, id, actual, lapsed)
	return tag.RowsAffected() == 1, err
}

// AtOnce is what a reservation or a record in one statement came to.
type AtOnce struct {
	Outcome AtOnceOutcome
	// Status and Token are the reserving task's, read under its share lock
	// (ReserveAtOnce's outcomes but AtOnceNoTask).
	Status arbortype.Status
	Token  int64
	// Reservation is the reservation made, found by its key, or recorded;
	// for AtOnceClosed, as it stood closed.
	Reservation ReservationRow
}

// AtOnceOutcome is the outcome of ReserveAtOnce or RecordAtOnce. Nothing
// was written but on AtOnceReserved and AtOnceRecorded.
type AtOnceOutcome string

const (
	// AtOnceReserved: the reservation (or spend) was made and charged.
	AtOnceReserved AtOnceOutcome = "reserved"
	// AtOnceAgain: the task has a reservation of that key already.
	AtOnceAgain AtOnceOutcome = "again"
	// AtOnceNoTask: no such task in the conversation.
	AtOnceNoTask AtOnceOutcome = "no_task"
	// AtOnceNotHeld: the task is not running under the token.
	AtOnceNotHeld AtOnceOutcome = "not_held"
	// AtOnceRare: not the common path — a budget over (or its wall time
	// run out), a counter no budget names, or a reservation of the counter
	// whose run is over to close first; the engine's transaction decides.
	AtOnceRare AtOnceOutcome = "rare"
	// AtOnceRecorded: the reservation was closed with the actual given.
	AtOnceRecorded AtOnceOutcome = "recorded"
	// AtOnceClosed: the reservation was closed before.
	AtOnceClosed AtOnceOutcome = "closed"
	// AtOnceNoReservation: no reservation of that id is the task's.
	AtOnceNoReservation AtOnceOutcome = "no_reservation"
	// AtOnceRaced: closed by another between its reading and its close.
	AtOnceRaced AtOnceOutcome = "raced"
)

// ReserveAtOnce makes r (a reservation of r.Amount of r.Counter for the
// run r.RunToken of task r.TaskID, keyed r.IdempotencyKey; closed at once
// with spend) in one statement when it is on the common path: the task
// share-locked, the counter's and wall time's budgets locked in the one
// order, checked, charged, the reservation inserted. Run outside a
// transaction it commits on its own.
func (s *Store) ReserveAtOnce(ctx context.Context, db DB, r ReservationRow, spend bool) (AtOnce, error) {
	return scanAtOnce(db.QueryRow(ctx, s.sql[qReserveAtOnce], r.ConversationID, r.TaskID, r.RunToken, r.Counter,
		r.Amount, r.IdempotencyKey, spend))
}

// RecordAtOnce closes reservation id of task taskID with actual in one
// statement: the counter's budgets locked, the reservation read again
// under them, closed, and charged to the budgets above the task.
func (s *Store) RecordAtOnce(ctx context.Context, db DB, conv string, taskID, id, actual int64) (AtOnce, error) {
	return scanAtOnce(db.QueryRow(ctx, s.sql[qRecordAtOnce], conv, taskID, id, actual))
}

func scanAtOnce(row pgx.Row) (AtOnce, error) {
	var o AtOnce
	r := &o.Reservation
	err := row.Scan(&o.Outcome, &o.Status, &o.Token, &r.ID, &r.ConversationID, &r.TaskID, &r.Counter, &r.RunToken,
		&r.IdempotencyKey, &r.Amount, &r.Actual, &r.Lapsed)
	return o, err
}

// OpenReservations reads the open reservations of a counter in a
// conversation, each with whether its run is over.
func (s *Store) OpenReservations(ctx context.Context, tx pgx.Tx, conv, counter string) ([]ReservationRow, error) {
	rows, err := tx.Query(ctx, s.sql[qOpenReservations], conv, counter)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReservationRow, error) {
		var r ReservationRow
		err := row.Scan(&r.ID, &r.ConversationID, &r.TaskID, &r.Counter, &r.RunToken, &r.IdempotencyKey,
			&r.Amount, &r.Actual, &r.Lapsed, &r.RunOver, &r.TenantBudgets)
		return r, err
	})
}

// TaskSpend is what one task recorded and holds of one counter.
type TaskSpend struct {
	TaskID   int64
	Counter  string
	Spent    int64
	Reserved int64
}

// SpendByTask reads each task's own spend in a conversation.
func (s *Store) SpendByTask(ctx context.Context, db DB, conv string) ([]TaskSpend, error) {
	rows, err := db.Query(ctx, s.sql[qSpendByTask], conv)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskSpend, error) {
		var t TaskSpend
		err := row.Scan(&t.TaskID, &t.Counter, &t.Spent, &t.Reserved)
		return t, err
	})
}

// ConversationCounter is one counter of one conversation.
type ConversationCounter struct {
	ConversationID string
	Counter        string
}

// LapsedReservations lists up to limit (conversation, counter) pairs with
// a reservation whose run is over.
func (s *Store) LapsedReservations(ctx context.Context, db DB, limit int) ([]ConversationCounter, error) {
	rows, err := db.Query(ctx, s.sql[qLapsedReservations], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConversationCounter, error) {
		var c ConversationCounter
		err := row.Scan(&c.ConversationID, &c.Counter)
		return c, err
	})
}

// OverWallTime lists up to limit live tasks under a "fail" wall-time
// budget that is over.
func (s *Store) OverWallTime(ctx context.Context, db DB, limit int) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql[qOverWallTime], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func collectBudgets(rows pgx.Rows, err error) ([]BudgetRow, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (BudgetRow, error) { return scanBudget(row) })
}

func nullMax(m int64) *int64 {
	if m == arbortype.Unlimited {
		return nil
	}
	return &m
}

// TenantBudgetRow is a row of tenant_budgets. Window is the unit of its
// window ("", "minute", "hour", "day"); WindowStart is nil without one.
// Max is arbortype.Unlimited for a tally. Now is the database's clock
// when it was read.
type TenantBudgetRow struct {
	ID          int64
	Tenant      string
	Counter     string
	Window      string
	WindowStart *time.Time
	Max         int64
	Spent       int64
	Reserved    int64
	OnExhausted arbortype.BudgetAction
	UpdatedAt   time.Time
	Now         time.Time
}

func collectTenantBudgets(rows pgx.Rows, err error) ([]TenantBudgetRow, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TenantBudgetRow, error) { return scanTenantBudget(row) })
}

func scanTenantBudget(row pgx.Row) (TenantBudgetRow, error) {
	var b TenantBudgetRow
	err := row.Scan(&b.ID, &b.Tenant, &b.Counter, &b.Window, &b.WindowStart, &b.Max, &b.Spent, &b.Reserved,
		&b.OnExhausted, &b.UpdatedAt, &b.Now)
	return b, err
}

// LockTenantBudgets locks the tenant's budgets of counter, by id, rolls
// over those whose window is over, and reads them as they then stand.
func (s *Store) LockTenantBudgets(ctx context.Context, tx pgx.Tx, tenant, counter string) ([]TenantBudgetRow, error) {
	return collectTenantBudgets(tx.Query(ctx, s.sql[qLockTenantBudgets], tenant, counter))
}

// ReadTenantBudgets reads, without locking, the tenant's budgets of the
// counters (all of them when counters is nil), a window that is over read
// as the current one with nothing spent.
func (s *Store) ReadTenantBudgets(ctx context.Context, db DB, tenant string, counters []string) ([]TenantBudgetRow, error) {
	return collectTenantBudgets(db.Query(ctx, s.sql[qReadTenantBudgets], tenant, counters))
}

// LockTenantBudgetWriters takes the advisory lock that queues the writers
// of a tenant's budgets (SetBudget), first in their transaction.
func (s *Store) LockTenantBudgetWriters(ctx context.Context, tx pgx.Tx, tenant string) error {
	_, err := tx.Exec(ctx, s.sql[qLockTenantBudgetWriters], tenant)
	return err
}

// LockTenantLiveConversations locks, in ascending id, every conversation
// of the tenant with a live task, and returns their ids.
func (s *Store) LockTenantLiveConversations(ctx context.Context, tx pgx.Tx, tenant string) ([]string, error) {
	rows, err := tx.Query(ctx, s.sql[qLockTenantLiveConversations], tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// InsertTenantBudget creates a tenant budget, counting from now; ok is
// false when the tenant has one of the counter and window already.
func (s *Store) InsertTenantBudget(ctx context.Context, tx pgx.Tx, b TenantBudgetRow) (TenantBudgetRow, bool, error) {
	row, err := scanTenantBudget(tx.QueryRow(ctx, s.sql[qInsertTenantBudget], b.Tenant, b.Counter, b.Window, nullMax(b.Max), b.OnExhausted))
	if IsNoRows(err) {
		return TenantBudgetRow{}, false, nil
	}
	return row, err == nil, err
}

// UpdateTenantBudget sets tenant budget id's maximum and action.
func (s *Store) UpdateTenantBudget(ctx context.Context, tx pgx.Tx, id, max int64, action arbortype.BudgetAction) (TenantBudgetRow, error) {
	return scanTenantBudget(tx.QueryRow(ctx, s.sql[qUpdateTenantBudget], id, nullMax(max), action))
}

// ChargeTenantBudgets moves held from reserved to spent as spent on the
// tenant budgets ids (locked by LockTenantBudgets before).
func (s *Store) ChargeTenantBudgets(ctx context.Context, tx pgx.Tx, ids []int64, held, spent int64) error {
	_, err := tx.Exec(ctx, s.sql[qChargeTenantBudgets], ids, held, spent)
	return err
}

// ConversationTenant reads a conversation's tenant.
func (s *Store) ConversationTenant(ctx context.Context, db DB, conv string) (string, error) {
	var t string
	err := db.QueryRow(ctx, s.sql[qConversationTenant], conv).Scan(&t)
	return t, err
}

func nonNilIDs(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}
