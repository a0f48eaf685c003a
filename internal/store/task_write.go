package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// Every write here sets the status it is given: the engine computes it with
// fsm.Transition first, and the database's guard trigger checks it again.

// InsertParams are the columns a new task is created with.
type InsertParams struct {
	ConversationID   string
	OwnerID          int64 // 0 for a root task
	Kind             string
	Background       bool
	Input            json.RawMessage
	RestartLimit     int
	AbandonOnRestart bool
	MaxRetries       int
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	IdempotencyKey   string // "" for none
	Deadline         *time.Time
	Trace            json.RawMessage // the trace context, a JSON object of strings; nil for none
	Tenant           string          // the conversation's, for a conversation the create makes ("" the default)
	Priority         int
	QueueTTL         time.Duration // 0 for none
	ConcurrencyKey   string        // "" for none
}

var (
	qInsertTask       = define("InsertTask")
	qCreateRoot       = define("CreateRoot")
	qAnnounce         = define("Announce")
	qCheckpointTask   = define("CheckpointTask")
	qHeartbeatTask    = define("HeartbeatTask")
	qAppendProgress   = define("AppendProgress")
	qSettleTask       = define("SettleTask")
	qSettleFailedTask = define("SettleFailedTask")
	qHoldTask         = define("HoldTask")
	qWaitTask         = define("WaitTask")
	qWakeTask         = define("WakeTask")
	qRecoverTasks     = define("RecoverTasks")
)

func micros(d time.Duration) int64 { return d.Microseconds() }

func marshalError(e *arbortype.TaskError) ([]byte, error) {
	if e == nil {
		return nil, nil
	}
	return json.Marshal(e)
}

// InsertTask creates a pending task.
func (s *Store) InsertTask(ctx context.Context, db DB, p InsertParams) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qInsertTask], p.ConversationID, p.OwnerID, p.Kind, p.Background,
		nullJSON(p.Input), p.RestartLimit, p.AbandonOnRestart, p.MaxRetries, p.IdempotencyKey,
		micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline, nullJSON(p.Trace),
		p.Priority, micros(p.QueueTTL), p.ConcurrencyKey))
}

// CreateRoot creates a root task, and its conversation on first use, in
// one statement (see qCreateRoot); ok is false, with nothing written, when
// the caller must take the transaction path.
//
// holder, when not 0, is a runner's holder row that may start the task in
// the statement (docs/design.md §3.18): then, if its row is live, the
// conversation is new and no concurrency limit could count the task, the
// conversation is inserted taken by it at epoch 1 and the task inserted
// running, with a task lease of lease.
func (s *Store) CreateRoot(ctx context.Context, db DB, p InsertParams, holder int64, lease time.Duration) (t arbortype.Task, ok bool, err error) {
	t, err = scanTask(db.QueryRow(ctx, s.sql[qCreateRoot], p.ConversationID, p.OwnerID, p.Kind, p.Background,
		nullJSON(p.Input), p.RestartLimit, p.AbandonOnRestart, p.MaxRetries, p.IdempotencyKey,
		micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline, nullJSON(p.Trace),
		p.Priority, micros(p.QueueTTL), p.ConcurrencyKey, p.Tenant, holder, micros(lease)))
	if IsNoRows(err) {
		return arbortype.Task{}, false, nil
	}
	return t, err == nil, err
}

// Announce notifies channel of each conversation of convs, in one
// statement committed on its own.
func (s *Store) Announce(ctx context.Context, db DB, channel string, convs []string) error {
	_, err := db.Exec(ctx, s.sql[qAnnounce], channel, convs)
	return err
}

// CheckpointTask replaces phase and state of a running task held with token
// and extends its lease. ErrNoRows means the write was fenced off.
func (s *Store) CheckpointTask(ctx context.Context, db DB, conv string, id, token int64, phase string, state json.RawMessage, lease time.Duration) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qCheckpointTask], id, token, phase, nullJSON(state), micros(lease), conv))
}

// HeartbeatTask extends the lease of a running task held with token.
// ErrNoRows means the write was fenced off.
func (s *Store) HeartbeatTask(ctx context.Context, db DB, conv string, id, token int64, lease time.Duration) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qHeartbeatTask], id, token, micros(lease), conv))
}

// AppendProgress appends a progress entry named name to the log of conv,
// for a running task held with token (see qAppendProgress). ErrNoRows
// means the write was fenced off.
func (s *Store) AppendProgress(ctx context.Context, db DB, conv string, id, token int64, name string, payload json.RawMessage) (int64, error) {
	var seq int64
	err := db.QueryRow(ctx, s.sql[qAppendProgress], conv, id, token, name, nullJSON(payload)).Scan(&seq)
	return seq, err
}

// SettleTask moves a task to the settled status `to`, recording result and
// error when they are not nil, and gives it the next settle sequence number.
func (s *Store) SettleTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, result json.RawMessage, taskErr *arbortype.TaskError) (arbortype.Task, error) {
	errJSON, err := marshalError(taskErr)
	if err != nil {
		return arbortype.Task{}, err
	}
	return scanTask(db.QueryRow(ctx, s.sql[qSettleTask], id, string(to), nullJSON(result), nullJSON(errJSON), conv))
}

// SettleFailedTask settles a task as failed (`to`) with taskErr as its
// error, appended to its error history (the newest historyLimit entries
// kept), in one statement.
func (s *Store) SettleFailedTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, taskErr *arbortype.TaskError, historyLimit int) (arbortype.Task, error) {
	errJSON, err := marshalError(taskErr)
	if err != nil {
		return arbortype.Task{}, err
	}
	entry, err := historyEntry(taskErr)
	if err != nil {
		return arbortype.Task{}, err
	}
	return scanTask(db.QueryRow(ctx, s.sql[qSettleFailedTask], id, string(to), nullJSON(errJSON), entry, historyLimit, conv))
}

// HoldTask moves a running task to `to` (completing), holding its result.
func (s *Store) HoldTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, result json.RawMessage) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qHoldTask], id, string(to), nullJSON(result), conv))
}

// WaitTask parks a running task on its children with the given policy,
// saving phase and state.
func (s *Store) WaitTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, phase string, state json.RawMessage, policy arbortype.WaitPolicy, childIDs []int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qWaitTask], id, string(to), phase, nullJSON(state), string(policy), childIDs, conv))
}

// WakeTask moves a waiting or sleeping task to `to` (pending). Its last
// wait (policy and ids) and wake time stay recorded.
func (s *Store) WakeTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qWakeTask], id, string(to), conv))
}

// RecoverTasks puts the running tasks among ids back to `to` (pending),
// with attempt + 1 when counted, in one statement, and returns the ids it
// moved.
func (s *Store) RecoverTasks(ctx context.Context, db DB, ids []int64, to arbortype.Status, counted bool) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qRecoverTasks], ids, string(to), counted))
}

// nullJSON turns an empty document into SQL NULL.
func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
