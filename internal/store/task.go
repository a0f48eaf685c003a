package store

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// taskScan is the destination of one task row: the row type, plus the
// columns that need decoding after the scan.
type taskScan struct {
	t            arbortype.Task
	status       string
	waitPolicy   string
	errRaw       []byte
	histRaw      []byte
	deliveredRaw []byte
	traceRaw     []byte
}

// taskColumnList names every column a task row is read with, beside where
// it goes: the SELECT list ({task_columns}) and the scan are both built from
// it, so a column is added in one place and can never be scanned into the
// wrong field.
var taskColumnList = []struct {
	sql  string
	dest func(*taskScan) any
}{
	{"id", func(s *taskScan) any { return &s.t.ID }},
	{"conversation_id", func(s *taskScan) any { return &s.t.ConversationID }},
	{"coalesce(owner_task_id, 0)", func(s *taskScan) any { return &s.t.OwnerID }},
	{"kind", func(s *taskScan) any { return &s.t.Kind }},
	{"status", func(s *taskScan) any { return &s.status }},
	{"background", func(s *taskScan) any { return &s.t.Background }},
	{"input", func(s *taskScan) any { return &s.t.Input }},
	{"phase", func(s *taskScan) any { return &s.t.Phase }},
	{"state", func(s *taskScan) any { return &s.t.State }},
	{"result", func(s *taskScan) any { return &s.t.Result }},
	{"error", func(s *taskScan) any { return &s.errRaw }},
	{"attempt", func(s *taskScan) any { return &s.t.Attempt }},
	{"restart_limit", func(s *taskScan) any { return &s.t.RestartLimit }},
	{"abandon_on_restart", func(s *taskScan) any { return &s.t.AbandonOnRestart }},
	{"abort_requested", func(s *taskScan) any { return &s.t.AbortRequested }},
	{"coalesce(wait_policy, '')", func(s *taskScan) any { return &s.waitPolicy }},
	{"wait_ids", func(s *taskScan) any { return &s.t.WaitIDs }},
	{"wake_at", func(s *taskScan) any { return &s.t.WakeAt }},
	{"sleep_seq", func(s *taskScan) any { return &s.t.SleepSeq }},
	{"max_retries", func(s *taskScan) any { return &s.t.MaxRetries }},
	{"retries", func(s *taskScan) any { return &s.t.Retries }},
	{"retry_backoff_base", func(s *taskScan) any { return &s.t.RetryBackoffBase }},
	{"retry_backoff_cap", func(s *taskScan) any { return &s.t.RetryBackoffCap }},
	{"error_history", func(s *taskScan) any { return &s.histRaw }},
	{"coalesce(wake_job_id, 0)", func(s *taskScan) any { return &s.t.WakeJobID }},
	{"coalesce(token, 0)", func(s *taskScan) any { return &s.t.Token }},
	{"coalesce(run_epoch, 0)", func(s *taskScan) any { return &s.t.Epoch }},
	{"lease_expires_at", func(s *taskScan) any { return &s.t.LeaseExpiresAt }},
	{"coalesce(idempotency_key, '')", func(s *taskScan) any { return &s.t.IdempotencyKey }},
	{"coalesce(settle_seq, 0)", func(s *taskScan) any { return &s.t.SettleSeq }},
	{"created_at", func(s *taskScan) any { return &s.t.CreatedAt }},
	{"updated_at", func(s *taskScan) any { return &s.t.UpdatedAt }},
	{"started_at", func(s *taskScan) any { return &s.t.StartedAt }},
	{"settled_at", func(s *taskScan) any { return &s.t.SettledAt }},
	{"coalesce(await_name, '')", func(s *taskScan) any { return &s.t.AwaitName }},
	{"coalesce(await_token, '')", func(s *taskScan) any { return &s.t.AwaitToken }},
	{"delivered", func(s *taskScan) any { return &s.deliveredRaw }},
	{"deadline", func(s *taskScan) any { return &s.t.Deadline }},
	{"trace", func(s *taskScan) any { return &s.traceRaw }},
	{"tenant", func(s *taskScan) any { return &s.t.Tenant }},
	{"priority", func(s *taskScan) any { return &s.t.Priority }},
	{"coalesce(concurrency_key, '')", func(s *taskScan) any { return &s.t.ConcurrencyKey }},
	{"queue_expires_at", func(s *taskScan) any { return &s.t.QueueExpiresAt }},
	{"coalesce(rerun_of, 0)", func(s *taskScan) any { return &s.t.RerunOf }},
}

// taskColumns is the SELECT list of a whole task row.
var taskColumns = columnSQL(taskColumnList)

// runColumnList is the narrower row a claim returns: what a handler's run
// reads (its input, checkpoint, last wait, attempt and limits, the run's
// token), without the columns of a settled task (result, error, history,
// settle fields) or the retry policy's details. Claims return many rows;
// every column left out is work saved per row on both sides.
var runColumnList = func() []taskColumn {
	skip := map[string]bool{"result": true, "error": true, "error_history": true, "coalesce(settle_seq, 0)": true,
		"settled_at": true, "coalesce(wake_job_id, 0)": true, "retry_backoff_base": true, "retry_backoff_cap": true}
	var out []taskColumn
	for _, c := range taskColumnList {
		if !skip[c.sql] {
			out = append(out, c)
		}
	}
	return out
}()

var runColumns = columnSQL(runColumnList)

type taskColumn = struct {
	sql  string
	dest func(*taskScan) any
}

func columnSQL(list []taskColumn) string {
	cols := make([]string, len(list))
	for i, c := range list {
		cols[i] = c.sql
	}
	return strings.Join(cols, ", ")
}

func scanTask(row pgx.Row, extra ...any) (arbortype.Task, error) {
	return scanColumns(taskColumnList, row, extra...)
}

func scanColumns(list []taskColumn, row pgx.Row, extra ...any) (arbortype.Task, error) {
	var s taskScan
	dest := make([]any, 0, len(list)+len(extra))
	for _, c := range list {
		dest = append(dest, c.dest(&s))
	}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return arbortype.Task{}, err
	}
	s.t.Status = arbortype.Status(s.status)
	s.t.WaitPolicy = arbortype.WaitPolicy(s.waitPolicy)
	if len(s.errRaw) > 0 {
		s.t.Error = new(arbortype.TaskError)
		if err := json.Unmarshal(s.errRaw, s.t.Error); err != nil {
			return arbortype.Task{}, err
		}
	}
	if len(s.histRaw) > 0 {
		if err := json.Unmarshal(s.histRaw, &s.t.ErrorHistory); err != nil {
			return arbortype.Task{}, err
		}
	}
	if len(s.deliveredRaw) > 0 {
		s.t.Delivered = new(arbortype.Delivered)
		if err := json.Unmarshal(s.deliveredRaw, s.t.Delivered); err != nil {
			return arbortype.Task{}, err
		}
	}
	if len(s.traceRaw) > 0 {
		if err := json.Unmarshal(s.traceRaw, &s.t.Trace); err != nil {
			return arbortype.Task{}, err
		}
	}
	return s.t, nil
}

func collectTasks(rows pgx.Rows, err error) ([]arbortype.Task, error) {
	return collectColumns(taskColumnList, rows, err)
}

// collectRunTasksXact reads run rows followed by the writing transaction's
// id (the same on every row), and returns that id too (0 for no rows).
func collectRunTasksXact(rows pgx.Rows, err error) ([]arbortype.Task, int64, error) {
	if err != nil {
		return nil, 0, err
	}
	var xact int64
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (arbortype.Task, error) {
		return scanColumns(runColumnList, row, &xact)
	})
	if err != nil {
		return nil, 0, err
	}
	return out, xact, nil
}

func collectColumns(list []taskColumn, rows pgx.Rows, err error) ([]arbortype.Task, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (arbortype.Task, error) { return scanColumns(list, row) })
}

// collect reads a one-column result into a slice.
func collect[T any](rows pgx.Rows, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[T])
}

// IsNoRows reports whether err says that no row matched.
func IsNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

var (
	qGetTask           = define("GetTask")
	qLockTask          = define("LockTask")
	qGetTasks          = define("GetTasks")
	qTaskConversation  = define("TaskConversation")
	qConversationTasks = define("ConversationTasks")
	qLiveChildren      = define("LiveChildren")
	qChildren          = define("Children")
	qHasLiveForeground = define("HasLiveForeground")
	qHasLiveWaited     = define("HasLiveWaited")
	qTaskByKey         = define("TaskByKey")
)

// GetTask reads one task without locking it.
func (s *Store) GetTask(ctx context.Context, db DB, id int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qGetTask], id))
}

// LockTask reads one task and locks its row until the transaction ends.
func (s *Store) LockTask(ctx context.Context, db DB, conv string, id int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qLockTask], id, conv))
}

// GetTasks reads the tasks with the given ids, in id order; ids that do not
// exist are left out.
func (s *Store) GetTasks(ctx context.Context, db DB, ids []int64) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qGetTasks], ids))
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
func (s *Store) ConversationTasks(ctx context.Context, db DB, conversationID string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qConversationTasks], conversationID))
}

// LiveChildren reads the live children of owner (foreground and background)
// in id order.
func (s *Store) LiveChildren(ctx context.Context, db DB, conv string, ownerID int64) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLiveChildren], ownerID, conv))
}

// Children reads every child of owner in id order.
func (s *Store) Children(ctx context.Context, db DB, conv string, ownerID int64) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qChildren], ownerID, conv))
}

// HasLiveForegroundChildren reports whether owner has a live, non-background
// child, at a cost that does not grow with the number of children.
func (s *Store) HasLiveForegroundChildren(ctx context.Context, db DB, conv string, ownerID int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql[qHasLiveForeground], ownerID, conv).Scan(&ok)
	return ok, err
}

// HasLiveWaitedChildren reports whether any of owner's children among
// waitIDs is live.
func (s *Store) HasLiveWaitedChildren(ctx context.Context, db DB, conv string, ownerID int64, waitIDs []int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql[qHasLiveWaited], ownerID, waitIDs, conv).Scan(&ok)
	return ok, err
}

// TaskByIdempotencyKey reads the task of a conversation created with key.
func (s *Store) TaskByIdempotencyKey(ctx context.Context, db DB, conversationID, key string) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qTaskByKey], conversationID, key))
}
