package store

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
)

// conversationColumns read conversation c (the alias is the statement's);
// its lease deadline is its holder's.
const conversationColumns = `c.id, coalesce(c.holder, ''), c.epoch,
		(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at`

var (
	qEnsureConversation = define(`INSERT INTO {schema}.conversations (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`)
	// Locking a conversation also announces it on ChangeChannel ($2): the
	// notification is delivered when the transaction commits (once, however
	// often it locked), and never if it rolls back, so the machine holding
	// the conversation hears of every multi-task change at no extra round trip.
	qLockConversation       = define(`SELECT ` + conversationColumns + `, pg_notify($2, c.id) FROM {schema}.conversations c WHERE c.id = $1 FOR NO KEY UPDATE OF c`)
	qLockConversationOfTask = define(`SELECT ` + conversationColumns + `, pg_notify($2, c.id) FROM {schema}.conversations c
		WHERE c.id = (SELECT conversation_id FROM {schema}.tasks WHERE id = $1) FOR NO KEY UPDATE OF c`)
	qGetConversation = define(`SELECT ` + conversationColumns + ` FROM {schema}.conversations c WHERE c.id = $1`)
)

func scanConversation(row interface{ Scan(...any) error }, extra ...any) (arbortype.Conversation, error) {
	var c arbortype.Conversation
	err := row.Scan(append([]any{&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &c.CreatedAt}, extra...)...)
	return c, err
}

// LockConversation locks a conversation's row until the transaction ends:
// the first lock of every transaction that can change more than one task
// (docs/design.md §5). ErrNoRows when it does not exist.
func (s *Store) LockConversation(ctx context.Context, db DB, id string) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qLockConversation], id, s.ChangeChannel()), &notified)
}

// LockConversationOfTask locks the conversation of a task (as
// LockConversation does, announcing it at commit) in one round trip: a
// task's conversation never changes, so reading it in the same statement is
// safe. ErrNoRows when the task does not exist.
func (s *Store) LockConversationOfTask(ctx context.Context, db DB, taskID int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qLockConversationOfTask], taskID, s.ChangeChannel()), &notified)
}

// EnsureAndLockConversation creates the conversation if it does not exist
// yet, then locks it.
func (s *Store) EnsureAndLockConversation(ctx context.Context, db DB, id string) (arbortype.Conversation, error) {
	c, err := s.LockConversation(ctx, db, id)
	if !IsNoRows(err) {
		return c, err
	}
	if _, err := db.Exec(ctx, s.sql[qEnsureConversation], id); err != nil {
		return arbortype.Conversation{}, err
	}
	return s.LockConversation(ctx, db, id)
}

// GetConversation reads a conversation without locking it.
func (s *Store) GetConversation(ctx context.Context, db DB, id string) (arbortype.Conversation, error) {
	return scanConversation(db.QueryRow(ctx, s.sql[qGetConversation], id))
}
