package store

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// Holders and conversation leases (docs/design.md §3.8, package machine's
// doc). A holder is one row of the holders table — a life of a runner's
// node, or one machine.Lease — and holds every conversation whose
// holder_id names it while its deadline (expires_at, by the database's
// clock) has not passed. Taking a conversation over bumps its epoch, so
// every fence a former holder writes with fails. Only the holder's own
// renewal locks its row: take-overs read it.

var (
	qNewHolder               = define("NewHolder")
	qRenewHolder             = define("RenewHolder")
	qDatabaseIdentity        = define("DatabaseIdentity")
	qEndDeadHolder           = define("EndDeadHolder")
	qEndHolder               = define("EndHolder")
	qPruneHolders            = define("PruneHolders")
	qTakeConversation        = define("TakeConversation")
	qLockHeldConversation    = define("LockHeldConversation")
	qTryLockHeldConversation = define("TryLockHeldConversation")
	qReleaseConversation     = define("ReleaseConversation")
	qFenceConversation       = define("FenceConversation")
)

// Taken is a conversation a holder took, and what the take-over found of
// the holder before it.
type Taken struct {
	arbortype.Conversation
	// PrevHolder is the former holder's row (0: it had none).
	PrevHolder int64
	// PrevRestarted says the former holder's last renewal came before the
	// database server's start.
	PrevRestarted bool
}

// NewHolder inserts a new holder row (a life) named name, live for ttl,
// and returns its id and its birth (created_at).
func (s *Store) NewHolder(ctx context.Context, db DB, name string, ttl time.Duration) (int64, time.Time, error) {
	var (
		id      int64
		created time.Time
	)
	err := db.QueryRow(ctx, s.sql[qNewHolder], name, micros(ttl)).Scan(&id, &created)
	return id, created, err
}

// DatabaseIdentity returns the cluster's system identifier and the
// database's name, as "<system identifier>/<name>".
func (s *Store) DatabaseIdentity(ctx context.Context, db DB) (string, error) {
	var id string
	err := db.QueryRow(ctx, s.sql[qDatabaseIdentity]).Scan(&id)
	return id, err
}

// EndDeadHolder ends holder row id (named name, born created) on the proof
// of holder row by, and reports whether it did.
func (s *Store) EndDeadHolder(ctx context.Context, db DB, id int64, name string, created time.Time, by int64) (bool, error) {
	var got int64
	err := db.QueryRow(ctx, s.sql[qEndDeadHolder], id, name, created, by).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// RenewHolder extends holder row id by ttl from now, if it has not expired.
// It reports whether it did: false when the row expired (or is gone).
func (s *Store) RenewHolder(ctx context.Context, db DB, id int64, ttl time.Duration) (bool, error) {
	var got int64
	err := db.QueryRow(ctx, s.sql[qRenewHolder], id, micros(ttl)).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// EndHolder removes holder row id if no conversation names it any more,
// and reports whether it did.
func (s *Store) EndHolder(ctx context.Context, db DB, id int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qEndHolder], id)
	return tag.RowsAffected() == 1, err
}

// PruneHolders removes up to limit holder rows expired for longer than
// after that no conversation names, and returns how many.
func (s *Store) PruneHolders(ctx context.Context, db DB, after time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, s.sql[qPruneHolders], micros(after), limit)
	return tag.RowsAffected(), err
}

// TakeConversation gives the conversation to holder (name and row id) with
// a fresh epoch, if it has no live holder. ErrNoRows when another holder's
// lease is live, when another transaction holds the row right now (skipped,
// not waited for), or when the conversation does not exist. The row stays
// locked until the transaction ends: recovery runs under it.
func (s *Store) TakeConversation(ctx context.Context, db DB, id, holder string, holderID int64) (Taken, error) {
	var t Taken
	c, err := scanConversation(db.QueryRow(ctx, s.sql[qTakeConversation], id, holder, holderID), &t.PrevHolder, &t.PrevRestarted)
	t.Conversation = c
	return t, err
}

// LockHeldConversation locks the conversation if holder row holderID still
// holds it at epoch (announcing it at commit, as LockConversation does).
// ErrNoRows when it does not.
func (s *Store) LockHeldConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qLockHeldConversation], id, holderID, epoch, s.ChangeChannel()), &notified)
}

// TryLockHeldConversation is LockHeldConversation that does not wait: a
// conversation another transaction holds locked is ErrNoRows too.
func (s *Store) TryLockHeldConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qTryLockHeldConversation], id, holderID, epoch, s.ChangeChannel()), &notified)
}

// ReleaseConversation frees a conversation holder row holderID holds at
// epoch. It reports whether it did (false: it had been taken over already).
func (s *Store) ReleaseConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qReleaseConversation], id, holderID, epoch)
	return tag.RowsAffected() == 1, err
}

// FenceConversation locks the conversation if holder row holderID still
// holds it at epoch. ErrNoRows when it does not: the caller lost its lease.
func (s *Store) FenceConversation(ctx context.Context, db DB, id string, holderID, epoch int64) error {
	var e int64
	return db.QueryRow(ctx, s.sql[qFenceConversation], id, holderID, epoch).Scan(&e)
}

// The maintenance leader's statements (store/queries/lease.sql).
var (
	qLeader     = define("Leader")
	qLockLeader = define("LockLeader")
	qTakeLeader = define("TakeLeader")
)

// Leader returns the holder row the maintenance leader's row names (0:
// none, or no row), and whether that holder row is live.
func (s *Store) Leader(ctx context.Context, db DB) (holderID int64, live bool, err error) {
	err = db.QueryRow(ctx, s.sql[qLeader]).Scan(&holderID, &live)
	if IsNoRows(err) {
		return 0, false, nil
	}
	return holderID, live, err
}

// ElectLeader makes holder row holderID, if it is live, the maintenance
// leader if no live holder is, and reports whether it did. tx is the election's own
// transaction: the leader's row stays locked until it ends.
func (s *Store) ElectLeader(ctx context.Context, tx DB, holderID int64) (bool, error) {
	if _, err := tx.Exec(ctx, s.sql[qLockLeader]); err != nil {
		return false, err
	}
	var got int64
	err := tx.QueryRow(ctx, s.sql[qTakeLeader], holderID).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}
