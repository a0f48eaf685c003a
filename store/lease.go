package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/arborhq/arbor/fsm"
)

// Conversation leases (DESIGN §3.8). A machine holds a conversation by its
// row's owner, epoch and lease deadline; the deadline is always computed
// with the database's clock. Taking a conversation over bumps the epoch, so
// every fence a former holder writes with fails.

var (
	// SKIP LOCKED: a conversation another runner is taking over right now
	// (or that a transaction is working on) is skipped, not waited for; the
	// claim loop comes back to it.
	qTakeConversation = define(`UPDATE {schema}.conversations
		SET owner = $2, epoch = epoch + 1, lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
		WHERE id = (SELECT id FROM {schema}.conversations
			WHERE id = $1 AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < now())
			FOR NO KEY UPDATE SKIP LOCKED)
		RETURNING ` + conversationColumns)

	qRenewConversations = define(`UPDATE {schema}.conversations c
		SET lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
		FROM unnest($1::text[], $2::bigint[]) AS v(id, epoch)
		WHERE c.id = v.id AND c.epoch = v.epoch AND c.owner = $4
		RETURNING c.id`)

	qReleaseConversation = define(`UPDATE {schema}.conversations
		SET owner = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE id = $1 AND owner = $2 AND epoch = $3`)

	// FOR SHARE: a take-over (an UPDATE of the row) waits for the fenced
	// transaction to end, and the fenced transaction, if it comes second,
	// sees the new epoch.
	qFenceConversation = define(`SELECT epoch FROM {schema}.conversations
		WHERE id = $1 AND owner = $2 AND epoch = $3 FOR SHARE`)

	qClaimableConversations = define(`SELECT t.conversation_id
		FROM {schema}.tasks t JOIN {schema}.conversations c ON c.id = t.conversation_id
		WHERE (t.status = 'running' OR (t.status = 'pending' AND t.kind = ANY($1)))
		  AND (c.owner IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < now())
		GROUP BY t.conversation_id
		ORDER BY min(t.id)
		LIMIT $2`)

	qLiveRoots = define(`SELECT {task_columns} FROM {schema}.tasks
		WHERE conversation_id = $1 AND owner_task_id IS NULL
		  AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing')
		ORDER BY id`)

	qClaimRunnable = define(`WITH picked AS (
			SELECT id FROM {schema}.tasks
			WHERE conversation_id = $1 AND status = 'pending' AND NOT abort_requested
			  AND kind = ANY($2) AND (owner_task_id IS NOT NULL OR id = ANY($3))
			ORDER BY id LIMIT $4
			FOR NO KEY UPDATE SKIP LOCKED)
		UPDATE {schema}.tasks
		SET status = $5, token = nextval('{schema}.task_token_seq'::regclass),
		    started_at = coalesce(started_at, now()),
		    lease_expires_at = now() + $6 * interval '1 microsecond', updated_at = now()
		WHERE id IN (SELECT id FROM picked)
		RETURNING {task_columns}`)

	qHasRunnable = define(`SELECT EXISTS (SELECT 1 FROM {schema}.tasks
		WHERE conversation_id = $1 AND status = 'pending' AND NOT abort_requested
		  AND kind = ANY($2) AND (owner_task_id IS NOT NULL OR id = ANY($3)))`)

	qTasksInStatus = define(`SELECT {task_columns} FROM {schema}.tasks
		WHERE conversation_id = $1 AND status = $2 ORDER BY id`)

	qRunStates = define(`SELECT id, status, coalesce(token, 0) FROM {schema}.tasks WHERE id = ANY($1)`)

	qStaleUnknownKinds = define(`SELECT id FROM {schema}.tasks
		WHERE status = 'pending' AND started_at IS NULL AND NOT (kind = ANY($1))
		  AND created_at < now() - $2 * interval '1 microsecond'
		ORDER BY id LIMIT $3`)
)

// TakeConversation gives the conversation to owner with a fresh epoch and a
// lease of ttl, if it is free or its lease expired. ErrNoRows when another
// holder's lease is live, when another transaction holds the row right now
// (skipped, not waited for), or when the conversation does not exist. The row stays
// locked until the transaction ends: reconcile_on_open runs under it.
func (s *Store) TakeConversation(ctx context.Context, db DB, id, owner string, ttl time.Duration) (Conversation, error) {
	return scanConversation(db.QueryRow(ctx, s.sql[qTakeConversation], id, owner, micros(ttl)))
}

// RenewConversations extends the leases owner holds on ids (at the epochs
// given, same index) and returns the ids it renewed: a missing one was taken
// over.
func (s *Store) RenewConversations(ctx context.Context, db DB, owner string, ids []string, epochs []int64, ttl time.Duration) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qRenewConversations], ids, epochs, micros(ttl), owner))
}

// ReleaseConversation frees a conversation owner holds at epoch. It reports
// whether it did (false: it had been taken over already).
func (s *Store) ReleaseConversation(ctx context.Context, db DB, id, owner string, epoch int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qReleaseConversation], id, owner, epoch)
	return tag.RowsAffected() == 1, err
}

// FenceConversation share-locks the conversation if owner still holds it at
// epoch. ErrNoRows when it does not: the caller lost its lease.
func (s *Store) FenceConversation(ctx context.Context, db DB, id, owner string, epoch int64) error {
	var e int64
	return db.QueryRow(ctx, s.sql[qFenceConversation], id, owner, epoch).Scan(&e)
}

// ClaimableConversations lists up to limit conversations with no live holder
// that have work for a node knowing kinds: a pending task of one of those
// kinds, or a running task left by a dead holder.
func (s *Store) ClaimableConversations(ctx context.Context, db DB, kinds []string, limit int) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qClaimableConversations], kinds, limit))
}

// LiveRoots reads a conversation's live root tasks in id order.
func (s *Store) LiveRoots(ctx context.Context, db DB, conversationID string) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLiveRoots], conversationID))
}

// ClaimRunnable starts up to limit pending tasks of a conversation whose
// kind is among kinds, children and the roots listed in roots only, oldest
// first, skipping locked rows.
func (s *Store) ClaimRunnable(ctx context.Context, db DB, conversationID string, kinds []string, roots []int64, limit int, to fsm.Status, lease time.Duration) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qClaimRunnable], conversationID, kinds, roots, limit, string(to), micros(lease)))
}

// HasRunnable reports whether ClaimRunnable would find a task.
func (s *Store) HasRunnable(ctx context.Context, db DB, conversationID string, kinds []string, roots []int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql[qHasRunnable], conversationID, kinds, roots).Scan(&ok)
	return ok, err
}

// TasksInStatus reads a conversation's tasks in one status, in id order.
func (s *Store) TasksInStatus(ctx context.Context, db DB, conversationID string, status fsm.Status) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qTasksInStatus], conversationID, string(status)))
}

// RunState is what a runner needs to know about a task it runs.
type RunState struct {
	ID     int64
	Status fsm.Status
	Token  int64
}

// RunStates reads status and token of the tasks with the given ids.
func (s *Store) RunStates(ctx context.Context, db DB, ids []int64) ([]RunState, error) {
	rows, err := db.Query(ctx, s.sql[qRunStates], ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RunState
	for rows.Next() {
		var (
			rs     RunState
			status string
		)
		if err := rows.Scan(&rs.ID, &status, &rs.Token); err != nil {
			return nil, err
		}
		rs.Status = fsm.Status(status)
		out = append(out, rs)
	}
	return out, rows.Err()
}

// StaleUnknownKinds lists up to limit pending tasks that never ran, whose
// kind is not among kinds, created longer than grace ago.
func (s *Store) StaleUnknownKinds(ctx context.Context, db DB, kinds []string, grace time.Duration, limit int) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qStaleUnknownKinds], kinds, micros(grace), limit))
}

// ChangeChannel is the LISTEN/NOTIFY channel on which every transaction that
// changes more than one task announces its conversation (the payload is the
// conversation id), at commit. Hashed from the schema like SleepChannel.
func (s *Store) ChangeChannel() string {
	sum := sha256.Sum256([]byte(s.schema))
	return "arbor_changes_" + hex.EncodeToString(sum[:8])
}
