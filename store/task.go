package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// WaitPolicy says when a waiting task wakes (DESIGN §3.4).
type WaitPolicy string

const (
	// AllSettled wakes the parent when every waited child is settled.
	AllSettled WaitPolicy = "all_settled"
	// FailFast wakes the parent at the first waited child that settles other
	// than completed, and aborts the other live waited children.
	FailFast WaitPolicy = "fail_fast"
)

// TaskError is the recorded error of a failed (or retried) task.
type TaskError struct {
	// Code is a short machine-readable cause, such as "restart_limit_exceeded";
	// empty for an error the handler reported.
	Code string `json:"code,omitempty"`
	// Message is the error's text, truncated to the engine's limit.
	Message string `json:"message"`
	// Detail is optional JSON the handler attached.
	Detail json.RawMessage `json:"detail,omitempty"`
	// NonRetryable makes a failure final even when the task has retries
	// left (see tasks.NonRetryable).
	NonRetryable bool `json:"non_retryable,omitempty"`
}

// Task is one row of the tasks table.
type Task struct {
	ID             int64
	ConversationID string
	// OwnerID is the task that created this one; 0 for a root task.
	OwnerID          int64
	Kind             string
	Status           fsm.Status
	Background       bool
	Input            json.RawMessage
	Phase            string
	State            json.RawMessage
	Result           json.RawMessage
	Error            *TaskError
	Attempt          int
	RestartLimit     int
	AbandonOnRestart bool
	AbortRequested   bool
	WaitPolicy       WaitPolicy
	WaitIDs          []int64
	WakeAt           *time.Time
	SleepSeq         int64
	MaxRetries       int
	Retries          int
	// WakeJobID is the River job that wakes the task from its current (or
	// last) sleep; 0 if it never slept.
	WakeJobID int64
	// RetryBackoffBase and RetryBackoffCap are the task's backoff policy.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// ErrorHistory holds the task's failed runs, oldest first, bounded.
	ErrorHistory []FailedTry
	// Token is the fencing token of the current run of a running task; 0
	// when it is not running.
	Token          int64
	LeaseExpiresAt *time.Time
	IdempotencyKey string
	// SettleSeq orders settles; 0 while the task is live.
	SettleSeq int64
	CreatedAt time.Time
	UpdatedAt time.Time
	StartedAt *time.Time
	SettledAt *time.Time
}

const taskColumns = `id, conversation_id, coalesce(owner_task_id, 0), kind, status, background, input,
	phase, state, result, error, attempt, restart_limit, abandon_on_restart, abort_requested,
	coalesce(wait_policy, ''), wait_ids, wake_at, sleep_seq, max_retries, retries, coalesce(token, 0),
	lease_expires_at, coalesce(idempotency_key, ''), coalesce(settle_seq, 0), created_at, updated_at,
	started_at, settled_at, coalesce(wake_job_id, 0), retry_backoff_base, retry_backoff_cap, error_history`

func scanTask(row pgx.Row, extra ...any) (Task, error) {
	var (
		t       Task
		status  string
		errRaw  []byte
		histRaw []byte
	)
	err := row.Scan(append([]any{&t.ID, &t.ConversationID, &t.OwnerID, &t.Kind, &status, &t.Background, &t.Input,
		&t.Phase, &t.State, &t.Result, &errRaw, &t.Attempt, &t.RestartLimit, &t.AbandonOnRestart, &t.AbortRequested,
		&t.WaitPolicy, &t.WaitIDs, &t.WakeAt, &t.SleepSeq, &t.MaxRetries, &t.Retries, &t.Token,
		&t.LeaseExpiresAt, &t.IdempotencyKey, &t.SettleSeq, &t.CreatedAt, &t.UpdatedAt,
		&t.StartedAt, &t.SettledAt, &t.WakeJobID, &t.RetryBackoffBase, &t.RetryBackoffCap, &histRaw}, extra...)...)
	if err != nil {
		return Task{}, err
	}
	t.Status = fsm.Status(status)
	if len(errRaw) > 0 {
		t.Error = new(TaskError)
		if err := json.Unmarshal(errRaw, t.Error); err != nil {
			return Task{}, err
		}
	}
	if len(histRaw) > 0 {
		if err := json.Unmarshal(histRaw, &t.ErrorHistory); err != nil {
			return Task{}, err
		}
	}
	return t, nil
}

func collectTasks(rows pgx.Rows, err error) ([]Task, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// collect reads a one-column result into a slice.
func collect[T any](rows pgx.Rows, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[T])
}

// ErrNoRows is returned by the single-row functions when no row matched.
var ErrNoRows = pgx.ErrNoRows

// IsNoRows reports whether err says that no row matched.
func IsNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

var (
	qGetTask           = define(`SELECT {task_columns} FROM {schema}.tasks WHERE id = $1`)
	qLockTask          = define(`SELECT {task_columns} FROM {schema}.tasks WHERE id = $1 FOR NO KEY UPDATE`)
	qGetTasks          = define(`SELECT {task_columns} FROM {schema}.tasks WHERE id = ANY($1) ORDER BY id`)
	qLockTasks         = define(`SELECT {task_columns} FROM {schema}.tasks WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`)
	qTaskConversation  = define(`SELECT conversation_id FROM {schema}.tasks WHERE id = $1`)
	qConversationTasks = define(`SELECT {task_columns} FROM {schema}.tasks WHERE conversation_id = $1 ORDER BY id`)
	qLiveChildren      = define(`SELECT {task_columns} FROM {schema}.tasks
		WHERE owner_task_id = $1 AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing')
		ORDER BY id`)
	qChildren = define(`SELECT {task_columns} FROM {schema}.tasks WHERE owner_task_id = $1 ORDER BY id`)
	// The first live foreground child is found by the live-children index
	// and EXISTS stops there, so this costs the same with 1 or 10,000 children.
	qHasLiveForeground = define(`SELECT EXISTS (SELECT 1 FROM {schema}.tasks
		WHERE owner_task_id = $1 AND NOT background
		  AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing'))`)
	// "id + 0" keeps the planner on the live-children index: probing the
	// primary key for every waited id would cost as many probes as children.
	qHasLiveWaited = define(`SELECT EXISTS (SELECT 1 FROM {schema}.tasks
		WHERE owner_task_id = $1 AND id + 0 = ANY($2)
		  AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing'))`)
	qTaskByKey = define(`SELECT {task_columns} FROM {schema}.tasks WHERE conversation_id = $1 AND idempotency_key = $2`)
)

// GetTask reads one task without locking it.
func (s *Store) GetTask(ctx context.Context, db DB, id int64) (Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qGetTask], id))
}

// LockTask reads one task and locks its row until the transaction ends.
func (s *Store) LockTask(ctx context.Context, db DB, id int64) (Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qLockTask], id))
}

// GetTasks reads the tasks with the given ids, in id order; ids that do not
// exist are left out.
func (s *Store) GetTasks(ctx context.Context, db DB, ids []int64) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qGetTasks], ids))
}

// LockTasks reads and locks the tasks with the given ids in ascending id
// order (DESIGN §5); ids that do not exist are left out.
func (s *Store) LockTasks(ctx context.Context, db DB, ids []int64) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLockTasks], ids))
}

// TaskConversation returns the conversation a task belongs to, without
// locking anything: conversation_id never changes, so the caller can lock the
// conversation row first and the task after it.
func (s *Store) TaskConversation(ctx context.Context, db DB, id int64) (string, error) {
	var conv string
	err := db.QueryRow(ctx, s.sql[qTaskConversation], id).Scan(&conv)
	return conv, err
}

// ConversationTasks reads every task of a conversation in id order.
func (s *Store) ConversationTasks(ctx context.Context, db DB, conversationID string) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qConversationTasks], conversationID))
}

// LiveChildren reads the live children of owner (foreground and background)
// in id order.
func (s *Store) LiveChildren(ctx context.Context, db DB, ownerID int64) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLiveChildren], ownerID))
}

// Children reads every child of owner in id order.
func (s *Store) Children(ctx context.Context, db DB, ownerID int64) ([]Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qChildren], ownerID))
}

// HasLiveForegroundChildren reports whether owner has a live, non-background
// child, at a cost that does not grow with the number of children.
func (s *Store) HasLiveForegroundChildren(ctx context.Context, db DB, ownerID int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql[qHasLiveForeground], ownerID).Scan(&ok)
	return ok, err
}

// HasLiveWaitedChildren reports whether any of owner's children among
// waitIDs is live.
func (s *Store) HasLiveWaitedChildren(ctx context.Context, db DB, ownerID int64, waitIDs []int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql[qHasLiveWaited], ownerID, waitIDs).Scan(&ok)
	return ok, err
}

// TaskByIdempotencyKey reads the task of a conversation created with key.
func (s *Store) TaskByIdempotencyKey(ctx context.Context, db DB, conversationID, key string) (Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qTaskByKey], conversationID, key))
}
