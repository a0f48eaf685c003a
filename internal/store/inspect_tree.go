package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Awaits in the order of the awaiting index, after the key ($1, $2, $3).
var qAwaitsAfter = define("AwaitsAfter")

// One conversation's awaits, after the key ($2, $3), along the same index.
var qConversationAwaitsAfter = define("ConversationAwaitsAfter")

// ConversationAwaitsAfter lists up to limit tasks of conv awaiting an
// event, after the key (await name, task id).
func (s *Store) ConversationAwaitsAfter(ctx context.Context, db DB, conv, name string, id int64, limit int) ([]TaskSummary, error) {
	return collectSummaries(db.Query(ctx, s.sql[qConversationAwaitsAfter], conv, name, id, limit))
}

// AwaitsAfter lists up to limit tasks awaiting an event (each with its
// AwaitToken), across conversations, after the key (conversation, await
// name, task id) in the order of the awaiting index.
func (s *Store) AwaitsAfter(ctx context.Context, db DB, conv, name string, id int64, limit int) ([]TaskSummary, error) {
	return collectSummaries(db.Query(ctx, s.sql[qAwaitsAfter], conv, name, id, limit))
}

var (
	qTreePage     = define("TreePage")
	qChildrenPage = define("ChildrenPage")
	qChildCounts  = define("ChildCounts")
	qStatusCounts = define("StatusCounts")
)

// TreePage reads up to limit tasks of conv after task id after, in id
// order, those in statuses when it is not empty.
func (s *Store) TreePage(ctx context.Context, db DB, conv string, after int64, statuses []string, limit int) ([]TaskSummary, error) {
	if statuses == nil {
		statuses = []string{}
	}
	return collectSummaries(db.Query(ctx, s.sql[qTreePage], conv, after, statuses, limit))
}

// ChildrenPage reads up to limit children of owner after task id after,
// in id order.
func (s *Store) ChildrenPage(ctx context.Context, db DB, conv string, owner, after int64, limit int) ([]TaskSummary, error) {
	return collectSummaries(db.Query(ctx, s.sql[qChildrenPage], conv, owner, after, limit))
}

// ChildCounts counts the children of each of owners (those with none are
// absent).
func (s *Store) ChildCounts(ctx context.Context, db DB, conv string, owners []int64) (map[int64]int, error) {
	rows, err := db.Query(ctx, s.sql[qChildCounts], conv, owners)
	if err != nil {
		return nil, err
	}
	out := map[int64]int{}
	var (
		id int64
		n  int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	return out, err
}

// StatusCounts counts conv's tasks by status, reading at most limit.
func (s *Store) StatusCounts(ctx context.Context, db DB, conv string, limit int) (map[arbortype.Status]int, error) {
	rows, err := db.Query(ctx, s.sql[qStatusCounts], conv, limit)
	if err != nil {
		return nil, err
	}
	out := map[arbortype.Status]int{}
	var (
		st string
		n  int
	)
	_, err = pgx.ForEachRow(rows, []any{&st, &n}, func() error {
		out[arbortype.Status(st)] = n
		return nil
	})
	return out, err
}
