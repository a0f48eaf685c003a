package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
)

// The node runner's statements: each covers every conversation (or task) of
// a batch at once.

var (
	qOpenConversations = define("OpenConversations")
	qOpenNamed         = define("OpenNamed")
	qReopen            = define("Reopen")
	qCountOpenable     = define("CountOpenable")
	qRunningIn         = define("RunningIn")
	qToRepair          = define("ToRepair")
	qReleaseIdle       = define("ReleaseIdle")
	qXactID            = define("XactID")
	qXactStatus        = define("XactStatus")
	qLockHeld          = define("LockHeld")
	qHeldBy            = define("HeldBy")
)

// OpenedLease is a conversation a node took: its id and new epoch, the
// opening transaction's id, whether it needs recovery, and what the
// take-over found of the holder before it (see Taken).
type OpenedLease struct {
	ConversationID string
	Epoch          int64
	Xact           int64
	Recover        bool
	PrevHolder     int64
	PrevRestarted  bool
	Tenant         string
}

// OpenConversations gives holder (its name and row) up to limit
// conversations that have work for kinds (nil: any kind) and no live
// holder, fairly across tenants: it looks at up to tenants tenants with
// pending work, from the one after the tenant after (nil: from the first;
// wrapping around); scan bounds how
// many conversations of lapsed holders are looked at. Their rows stay
// locked until the transaction ends.
func (s *Store) OpenConversations(ctx context.Context, db DB, holder string, holderID int64, kinds []string, limit, scan int, after *string, tenants int, busy Busy) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qOpenConversations], holder, holderID, kinds, limit, scan, after, tenants, busy.Tenants, busy.Runs))
}

// Reopen locks, in id order, the conversations among ids (at the epochs
// given, same index) that holder row holderID still holds and no other
// transaction holds, and returns them as an open would (their epochs
// unchanged). Their rows stay locked until the transaction ends.
func (s *Store) Reopen(ctx context.Context, db DB, holderID int64, ids []string, epochs []int64) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qReopen], holderID, ids, epochs))
}

// CountOpenable says how many conversations (at most limit) an open for
// kinds would find among named (nil: by a scan of the oldest scan pending
// tasks).
func (s *Store) CountOpenable(ctx context.Context, db DB, kinds []string, limit int, named []string, scan int) (int, error) {
	var n int
	err := db.QueryRow(ctx, s.sql[qCountOpenable], kinds, limit, named, scan).Scan(&n)
	return n, err
}

// OpenNamed is OpenConversations among the conversations ids only.
func (s *Store) OpenNamed(ctx context.Context, db DB, holder string, holderID int64, kinds []string, limit int, ids []string, busy Busy) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qOpenNamed], holder, holderID, kinds, limit, ids, busy.Tenants, busy.Runs))
}

func collectOpened(rows pgx.Rows, err error) ([]OpenedLease, error) {
	if err != nil {
		return nil, err
	}
	// The open's columns (node.sql) are OpenedLease's fields, in its order.
	return pgx.CollectRows(rows, pgx.RowToStructByPos[OpenedLease])
}

// RunningIn reads the running tasks of the conversations, in id order.
func (s *Store) RunningIn(ctx context.Context, db DB, convs []string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qRunningIn], convs))
}

// ToRepair lists the waiting tasks with satisfied waits and the completing
// tasks with no live foreground child in the conversations, deepest first.
func (s *Store) ToRepair(ctx context.Context, db DB, convs []string) (ids []int64, statuses []arbortype.Status, err error) {
	rows, err := db.Query(ctx, s.sql[qToRepair], convs)
	if err != nil {
		return nil, nil, err
	}
	var (
		id int64
		st string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error {
		ids, statuses = append(ids, id), append(statuses, arbortype.Status(st))
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return ids, statuses, nil
}

// ReleaseIdle frees the conversations holder holds at the epochs given
// (same index) that have no running task, and returns those it freed.
func (s *Store) ReleaseIdle(ctx context.Context, db DB, holder int64, ids []string, epochs []int64) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qReleaseIdle], ids, epochs, holder))
}

// LockHeld locks, in id order, the conversations among ids that holder
// holds, that have a pending task, and that no other transaction holds.
// It returns those with a pending task (work) and, of them, those it
// locked.
func (s *Store) LockHeld(ctx context.Context, db DB, ids []string, holder int64) (work, locked []string, err error) {
	// Two arrays in one row: a join of the two sets, planned over
	// statistics that expect none of them, compared every one with every
	// other.
	err = db.QueryRow(ctx, s.sql[qLockHeld], ids, holder).Scan(&work, &locked)
	return work, locked, err
}

// XactID returns the id of db's transaction (assigning one).
func (s *Store) XactID(ctx context.Context, db DB) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, s.sql[qXactID]).Scan(&id)
	return id, err
}

// XactStatus says what became of transaction xact: "committed",
// "aborted", "in progress", "" when it is too old to know, or "future"
// when the server never gave the id out (pg_xact_status refuses an id past
// the server's next one with 22023, its only refusal of a valid id: the
// server is not the one the transaction ran on, but a standby promoted
// before the transaction's records reached it).
func (s *Store) XactStatus(ctx context.Context, db DB, xact int64) (string, error) {
	var st string
	err := db.QueryRow(ctx, s.sql[qXactStatus], xact).Scan(&st)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22023" {
		return "future", nil
	}
	return st, err
}

// HeldBy lists the conversations holder row holder holds.
func (s *Store) HeldBy(ctx context.Context, db DB, holder int64) ([]OpenedLease, error) {
	rows, err := db.Query(ctx, s.sql[qHeldBy], holder)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OpenedLease, error) {
		var l OpenedLease
		err := row.Scan(&l.ConversationID, &l.Epoch)
		return l, err
	})
}
