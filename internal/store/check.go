package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

var (
	qConversationIDs     = define(`SELECT id FROM {schema}.conversations ORDER BY id`)
	qDuplicateLiveTokens = define(`SELECT token FROM {schema}.tasks
		WHERE conversation_id = $1 AND token IS NOT NULL GROUP BY token HAVING count(*) > 1`)
)

// ConversationIDs lists every conversation, in id order.
func (s *Store) ConversationIDs(ctx context.Context, db DB) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qConversationIDs]))
}

// DuplicateTokens lists fencing tokens held by more than one task of a
// conversation (there must be none).
func (s *Store) DuplicateTokens(ctx context.Context, db DB, conversationID string) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qDuplicateLiveTokens], conversationID))
}

// The newest status entry of each task of a conversation in its log (the
// conversation's entries by the log's index, newest first per task).
var qNewestStatusEntries = define(`SELECT DISTINCT ON (task_id) task_id, seq, status FROM {schema}.conversation_log
	WHERE conversation_id = $1 AND kind = 'status' AND task_id IS NOT NULL
	ORDER BY task_id, seq DESC`)

// LogStatus is a task's newest status entry in its conversation's log.
type LogStatus struct {
	TaskID int64
	Seq    int64
	Status string
}

// NewestStatusEntries returns the newest status entry of each task of
// conversationID that the log keeps one of.
func (s *Store) NewestStatusEntries(ctx context.Context, db DB, conversationID string) ([]LogStatus, error) {
	rows, err := db.Query(ctx, s.sql[qNewestStatusEntries], conversationID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[LogStatus])
}
