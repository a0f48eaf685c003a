package store

import "context"

var (
	qConversationIDs     = define(`SELECT id FROM {schema}.conversations ORDER BY id`)
	qDuplicateLiveTokens = define(`SELECT token FROM {schema}.tasks
		WHERE conversation_id = $1 AND token IS NOT NULL GROUP BY token HAVING count(*) > 1`)
)

// ConversationIDs lists every conversation, in id order.
func (s *Store) ConversationIDs(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, s.sql[qConversationIDs])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// DuplicateTokens lists fencing tokens held by more than one task of a
// conversation (there must be none).
func (s *Store) DuplicateTokens(ctx context.Context, db DB, conversationID string) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql[qDuplicateLiveTokens], conversationID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			return nil, err
		}
		out = append(out, tok)
	}
	return out, rows.Err()
}
