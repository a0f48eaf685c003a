package store

import "context"

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
