package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Starting tasks. Every start sets the same columns, under a lease the
// caller fenced in the same transaction: a fresh fencing token, the lease
// epoch the run starts under, started_at at the first start, and the task
// lease's deadline by the database's clock.

var (
	qStartTask         = define("StartTask")
	qClaimRunnable     = define("ClaimRunnable")
	qLiveRoots         = define("LiveRoots")
	qTasksInStatus     = define("TasksInStatus")
	qRunStates         = define("RunStates")
	qStaleUnknownKinds = define("StaleUnknownKinds")
)

// Run is where a start puts a task: the status of the start edge, the lease
// epoch fenced in the same transaction, and the task lease.
type Run struct {
	Status arbortype.Status
	Epoch  int64
	Lease  time.Duration
}

// StartTask starts the pending task id of conversationID if it is not
// abort-requested. ErrNoRows means the task was not startable; the caller
// reads it to say why.
func (s *Store) StartTask(ctx context.Context, db DB, conversationID string, id int64, run Run) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qStartTask], id, conversationID, string(run.Status), run.Epoch, micros(run.Lease)))
}

// ClaimRunnable starts up to limit pending tasks of a conversation whose
// kind is among kinds (nil: any), children and the roots listed in roots
// only (nil: any root), oldest first, skipping locked rows.
func (s *Store) ClaimRunnable(ctx context.Context, db DB, conversationID string, kinds []string, roots []int64, limit int, run Run) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qClaimRunnable], conversationID, kinds, roots, limit,
		string(run.Status), run.Epoch, micros(run.Lease)))
}

// LiveRoots reads a conversation's live root tasks in id order.
func (s *Store) LiveRoots(ctx context.Context, db DB, conversationID string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLiveRoots], conversationID))
}

// TasksInStatus reads a conversation's tasks in one status, in id order.
func (s *Store) TasksInStatus(ctx context.Context, db DB, conversationID string, status arbortype.Status) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qTasksInStatus], conversationID, string(status)))
}

// RunState is what a runner needs to know about a task it runs.
type RunState struct {
	ID     int64
	Status arbortype.Status
	Token  int64
}

// RunStates reads status and token of the tasks with the given ids.
func (s *Store) RunStates(ctx context.Context, db DB, ids []int64) ([]RunState, error) {
	rows, err := db.Query(ctx, s.sql[qRunStates], ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunState, error) {
		var (
			rs     RunState
			status string
		)
		err := row.Scan(&rs.ID, &status, &rs.Token)
		rs.Status = arbortype.Status(status)
		return rs, err
	})
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

var qClaimTasksUnfenced = define("ClaimTasksUnfenced")

// ClaimTasksUnfenced starts up to limit pending tasks of every conversation,
// oldest first, without any lease. Only the benchmarks' engine-loop
// reference line calls it: it measures the engine's operations without a
// runner, and a runner never starts a task outside a lease.
func (s *Store) ClaimTasksUnfenced(ctx context.Context, db DB, limit int, status arbortype.Status, lease time.Duration) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qClaimTasksUnfenced], limit, string(status), micros(lease)))
}
