package store

import (
	"cmp"
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Fork: a conversation's settled history copied into a new conversation
// (docs/agents.md, "Fork: edit and regenerate"). Every copied row names its
// source (forked_from) and the guard checks it is a faithful copy
// (guardrules.ForkRules).

var (
	qInsertForkConversation = define("InsertForkConversation")
	qForkSource             = define("ForkSource")
	qForkEvents             = define("ForkEvents")
	qNextTaskIDs            = define("NextTaskIDs")
	qNextSettles            = define("NextSettles")
	qNextEventIDs           = define("NextEventIDs")
	qInsertForkTasks        = define("InsertForkTasks")
	qInsertForkEvents       = define("InsertForkEvents")
	qInsertForkLog          = define("InsertForkLog")
)

// InsertForkConversation inserts conversation id for a fork, and reports
// false when it exists already.
func (s *Store) InsertForkConversation(ctx context.Context, tx pgx.Tx, id, from string) (bool, error) {
	var got string
	err := tx.QueryRow(ctx, s.sql[qInsertForkConversation], id, from).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// ForkCounts counts what a fork copied.
type ForkCounts struct {
	Tasks, Events, LogEntries int64
}

// CopyHistory copies the settled history of conversation from through
// turn through into conversation to (inserted already): tasks with new ids
// (owners, waits and delivered events remapped), their events, and the log
// up to the copied tasks' last entry.
func (s *Store) CopyHistory(ctx context.Context, tx pgx.Tx, from string, through int64, to string) (ForkCounts, error) {
	var c ForkCounts
	rows, err := tx.Query(ctx, s.sql[qForkSource], planAfresh, from, through)
	if err != nil {
		return c, err
	}
	type src struct{ id, settle int64 }
	source, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (src, error) {
		var v src
		err := row.Scan(&v.id, &v.settle)
		return v, err
	})
	if err != nil {
		return c, err
	}
	oldIDs := make([]int64, len(source))
	for i, v := range source {
		oldIDs[i] = v.id
	}
	newIDs, err := s.sequence(ctx, tx, qNextTaskIDs, len(source))
	if err != nil {
		return c, err
	}
	// The copies settle in their sources' order.
	settles, err := s.sequence(ctx, tx, qNextSettles, len(source))
	if err != nil {
		return c, err
	}
	bySettle := slices.Clone(source)
	slices.SortFunc(bySettle, func(a, b src) int { return cmp.Compare(a.settle, b.settle) })
	settleOf := map[int64]int64{}
	for i, v := range bySettle {
		settleOf[v.id] = settles[i]
	}
	newSettles := make([]int64, len(source))
	for i, v := range source {
		newSettles[i] = settleOf[v.id]
	}
	rows, err = tx.Query(ctx, s.sql[qForkEvents], planAfresh, from, oldIDs)
	if err != nil {
		return c, err
	}
	oldEvents, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return c, err
	}
	newEvents, err := s.sequence(ctx, tx, qNextEventIDs, len(oldEvents))
	if err != nil {
		return c, err
	}
	tag, err := tx.Exec(ctx, s.sql[qInsertForkTasks], planAfresh, to, oldIDs, newIDs, newSettles, oldEvents, newEvents)
	if err != nil {
		return c, err
	}
	c.Tasks = tag.RowsAffected()
	tag, err = tx.Exec(ctx, s.sql[qInsertForkEvents], planAfresh, to, oldIDs, newIDs, from, oldEvents, newEvents)
	if err != nil {
		return c, err
	}
	c.Events = tag.RowsAffected()
	tag, err = tx.Exec(ctx, s.sql[qInsertForkLog], planAfresh, to, from, oldIDs, newIDs, oldEvents, newEvents)
	if err != nil {
		return c, err
	}
	c.LogEntries = tag.RowsAffected()
	return c, nil
}

// sequence returns n values of a sequence, ascending.
func (s *Store) sequence(ctx context.Context, tx pgx.Tx, q query, n int) ([]int64, error) {
	rows, err := tx.Query(ctx, s.sql[q], n)
	if err != nil {
		return nil, err
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	slices.Sort(vals)
	return vals, err
}
