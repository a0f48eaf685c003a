package store

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
)

// Reruns (docs/design.md §3.17): a new task that runs a settled one again
// from its checkpoint.

var (
	qRerunTask   = define("RerunTask")
	qRerunOf     = define("RerunOf")
	qRerunInWait = define("RerunInWait")
)

// RerunTask inserts the rerun of task id of conversation conv and returns
// it.
func (s *Store) RerunTask(ctx context.Context, db DB, conv string, id int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qRerunTask], id, conv))
}

// RerunOf returns the id of the rerun of task id of conversation conv;
// ErrNoRows when it has none.
func (s *Store) RerunOf(ctx context.Context, db DB, conv string, id int64) (int64, error) {
	var rerun int64
	err := db.QueryRow(ctx, s.sql[qRerunOf], id, conv).Scan(&rerun)
	return rerun, err
}

// RerunInWait puts rerun in the place of task in the wait of owner (of
// conversation conv), and reports whether owner waited on task.
func (s *Store) RerunInWait(ctx context.Context, db DB, conv string, owner, task, rerun int64) (bool, error) {
	var got int64
	err := db.QueryRow(ctx, s.sql[qRerunInWait], owner, task, rerun, conv).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}
