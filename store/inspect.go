package store

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
)

// Queries for operators (the arbor command's ls). Unlike the engine's
// queries they span conversations, so they read only: they take no lock and
// are never part of an operation's transaction.

var qLiveConversations = define(`WITH live AS (
			SELECT conversation_id, status, count(*) AS n FROM {schema}.tasks
			WHERE status IN ({live})
			GROUP BY conversation_id, status),
		picked AS (
			SELECT DISTINCT conversation_id FROM live
			WHERE cardinality($1::text[]) = 0 OR status = ANY($1::text[])
			ORDER BY conversation_id LIMIT $2)
		SELECT c.id, coalesce(c.holder, ''), c.epoch,
			(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), l.status, l.n
		FROM picked p
		JOIN {schema}.conversations c ON c.id = p.conversation_id
		JOIN live l ON l.conversation_id = p.conversation_id
		ORDER BY c.id, l.status`)

// LiveConversations lists the conversations that have live tasks, in id
// order, at most limit of them (0: no limit). With statuses given, only the
// conversations with a live task in one of them are listed (their counts
// still cover every live status).
func (s *Store) LiveConversations(ctx context.Context, db DB, statuses []arbortype.Status, limit int) ([]arbortype.ConversationSummary, error) {
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	rows, err := db.Query(ctx, s.sql[qLiveConversations], names, lim)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []arbortype.ConversationSummary
	for rows.Next() {
		var (
			c      arbortype.ConversationSummary
			status string
			n      int
		)
		if err := rows.Scan(&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &status, &n); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].ID != c.ID {
			c.Live = map[arbortype.Status]int{}
			out = append(out, c)
		}
		out[len(out)-1].Live[arbortype.Status(status)] = n
	}
	return out, rows.Err()
}

var qRecentConversations = define(`WITH recent AS (
			SELECT conversation_id, max(id) AS last
			FROM (SELECT conversation_id, id FROM {schema}.tasks ORDER BY id DESC LIMIT 1000) t
			GROUP BY conversation_id
			ORDER BY last DESC LIMIT $1)
		SELECT ` + conversationColumns + `
		FROM recent r JOIN {schema}.conversations c ON c.id = r.conversation_id
		ORDER BY r.last DESC`)

// RecentConversations lists up to limit conversations that had a task
// created lately, the most recent first: those of the newest
// 1,000 tasks, live or settled. It reads those tasks backwards along the
// primary key, so that it costs the same on a table of a billion tasks as
// on one of a thousand.
func (s *Store) RecentConversations(ctx context.Context, db DB, limit int) ([]arbortype.Conversation, error) {
	rows, err := db.Query(ctx, s.sql[qRecentConversations], limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []arbortype.Conversation
	for rows.Next() {
		var c arbortype.Conversation
		if err := rows.Scan(&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &c.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
