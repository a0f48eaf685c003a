package store

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
)

var (
	qEnsureConversation     = define("EnsureConversation")
	qLockConversation       = define("LockConversation")
	qLockConversationOfTask = define("LockConversationOfTask")
	qGetConversation        = define("GetConversation")
)

func scanConversation(row interface{ Scan(...any) error }, extra ...any) (arbortype.Conversation, error) {
	var c arbortype.Conversation
	err := row.Scan(append([]any{&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &c.CreatedAt, &c.Tenant}, extra...)...)
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
func (s *Store) EnsureAndLockConversation(ctx context.Context, db DB, id, tenant string) (arbortype.Conversation, error) {
	c, err := s.LockConversation(ctx, db, id)
	if !IsNoRows(err) {
		return c, err
	}
	if _, err := db.Exec(ctx, s.sql[qEnsureConversation], id, tenant); err != nil {
		return arbortype.Conversation{}, err
	}
	return s.LockConversation(ctx, db, id)
}

// GetConversation reads a conversation without locking it.
func (s *Store) GetConversation(ctx context.Context, db DB, id string) (arbortype.Conversation, error) {
	return scanConversation(db.QueryRow(ctx, s.sql[qGetConversation], id))
}
