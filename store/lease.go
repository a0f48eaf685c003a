package store

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// Conversation leases (docs/design.md §3.8). A holder (a runner's node, or
// a caller's lease) holds a conversation by its row's holder, epoch and
// lease deadline; the deadline is always computed with the database's
// clock. Taking a conversation over bumps the epoch, so every fence a former
// holder writes with fails.

var (
	// SKIP LOCKED: a conversation another holder is taking over right now
	// (or that a transaction is working on) is skipped, not waited for; the
	// caller comes back to it.
	qTakeConversation = define(`UPDATE {schema}.conversations
		SET holder = $2, epoch = epoch + 1, lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
		WHERE id = (SELECT id FROM {schema}.conversations
			WHERE id = $1 AND (holder IS NULL OR lease_expires_at IS NULL OR lease_expires_at < now())
			FOR NO KEY UPDATE SKIP LOCKED)
		RETURNING ` + conversationColumns)

	// Many leases renewed in one statement: the rows locked in id order
	// first, like every transaction that locks several conversations (an
	// UPDATE from unnest would lock them in the order of its join, and
	// could deadlock with a flush).
	qRenewConversations = define(`WITH locked AS (
			SELECT c.id FROM {schema}.conversations c
			JOIN unnest($1::text[], $2::bigint[]) AS v(id, epoch) ON c.id = v.id AND c.epoch = v.epoch
			WHERE c.holder = $4
			ORDER BY c.id FOR NO KEY UPDATE OF c)
		UPDATE {schema}.conversations c
		SET lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
		FROM locked WHERE c.id = locked.id
		RETURNING c.id`)

	// The release locks the row (the engine requeues the holder's running
	// tasks in the same transaction, see LockHeldConversation) and frees it.
	qLockHeldConversation = define(`SELECT ` + conversationColumns + `, pg_notify($4, id) FROM {schema}.conversations
		WHERE id = $1 AND holder = $2 AND epoch = $3 FOR NO KEY UPDATE`)

	qReleaseConversation = define(`UPDATE {schema}.conversations
		SET holder = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE id = $1 AND holder = $2 AND epoch = $3`)

	// Locked: a take-over (an UPDATE of the row) waits for the fenced
	// transaction to end, and the fenced transaction, if it comes second,
	// sees the new epoch. Exclusively (FOR NO KEY UPDATE), as every writer
	// of the conversation's log holds it, so that the log's order is its
	// commit order.
	qFenceConversation = define(`SELECT epoch FROM {schema}.conversations
		WHERE id = $1 AND holder = $2 AND epoch = $3 FOR NO KEY UPDATE`)
)

// TakeConversation gives the conversation to holder with a fresh epoch and a
// lease of ttl, if it is free or its lease expired. ErrNoRows when another
// holder's lease is live, when another transaction holds the row right now
// (skipped, not waited for), or when the conversation does not exist. The
// row stays locked until the transaction ends: recovery runs under it.
func (s *Store) TakeConversation(ctx context.Context, db DB, id, holder string, ttl time.Duration) (arbortype.Conversation, error) {
	return scanConversation(db.QueryRow(ctx, s.sql[qTakeConversation], id, holder, micros(ttl)))
}

// RenewConversations extends the leases holder holds on ids (at the epochs
// given, same index) and returns the ids it renewed: a missing one was taken
// over.
func (s *Store) RenewConversations(ctx context.Context, db DB, holder string, ids []string, epochs []int64, ttl time.Duration) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qRenewConversations], ids, epochs, micros(ttl), holder))
}

// LockHeldConversation locks the conversation if holder still holds it at
// epoch (announcing it at commit, as LockConversation does). ErrNoRows when
// it does not.
func (s *Store) LockHeldConversation(ctx context.Context, db DB, id, holder string, epoch int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qLockHeldConversation], id, holder, epoch, s.ChangeChannel()), &notified)
}

// ReleaseConversation frees a conversation holder holds at epoch. It reports
// whether it did (false: it had been taken over already).
func (s *Store) ReleaseConversation(ctx context.Context, db DB, id, holder string, epoch int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qReleaseConversation], id, holder, epoch)
	return tag.RowsAffected() == 1, err
}

// FenceConversation share-locks the conversation if holder still holds it at
// epoch. ErrNoRows when it does not: the caller lost its lease.
func (s *Store) FenceConversation(ctx context.Context, db DB, id, holder string, epoch int64) error {
	var e int64
	return db.QueryRow(ctx, s.sql[qFenceConversation], id, holder, epoch).Scan(&e)
}
