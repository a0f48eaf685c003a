package store

import (
	"context"
	"encoding/json"
	"fmt"
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
}

var (
	qInsertTask = define(logged(`INSERT INTO {schema}.tasks AS t
		(conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
		 max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace)
		VALUES ($1, nullif($2::bigint, 0), $3, $4, $5, $6, $7, $8, nullif($9::text, ''),
		        $10 * interval '1 microsecond', $11 * interval '1 microsecond', $12, $13)`, "t", "{task_columns}", ""))

	// A root task created in one statement, and its conversation on first
	// use: the conversation row inserted (then no other transaction can
	// lock it until this one ends) or, when it exists, locked; the task
	// inserted after it. (It does not NOTIFY: the engine announces it after
	// the commit, see core's announce.go.) No row comes back when the conversation was created by a
	// transaction that committed after this statement's snapshot, or when
	// the idempotency key is taken: the caller then takes the transaction
	// path, which handles both.
	qCreateRoot = define(`WITH conv AS (
			INSERT INTO {schema}.conversations (id) VALUES ($1) ON CONFLICT (id) DO NOTHING RETURNING id),
		locked AS (
			SELECT id FROM {schema}.conversations WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM conv) FOR NO KEY UPDATE),
		ready AS (SELECT id FROM conv UNION ALL SELECT id FROM locked),
		w AS (
			INSERT INTO {schema}.tasks AS t
			(conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
			 max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace)
			SELECT ready.id, nullif($2::bigint, 0), $3, $4, $5, $6, $7, $8, nullif($9::text, ''),
			       $10 * interval '1 microsecond', $11 * interval '1 microsecond', $12::timestamptz, $13::jsonb
			FROM ready
			ON CONFLICT (conversation_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
			RETURNING t.*),
		logged AS (` + logStatus + `)
		SELECT {task_columns} FROM w`)

	qAnnounce = define(`SELECT pg_notify($1, c) FROM unnest($2::text[]) AS c`)

	qCheckpointTask = define(`UPDATE {schema}.tasks
		SET phase = $3, state = $4, lease_expires_at = now() + $5 * interval '1 microsecond', updated_at = now()
		WHERE id = $1 AND conversation_id = $6 AND token = $2 AND status = 'running' AND NOT abort_requested
		RETURNING {task_columns}`)

	qHeartbeatTask = define(`UPDATE {schema}.tasks
		SET lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
		WHERE id = $1 AND conversation_id = $4 AND token = $2 AND status = 'running' AND NOT abort_requested
		RETURNING {task_columns}`)

	// A progress entry of a running task held with token, in one
	// statement that commits on its own (Run.Progress): the conversation's
	// row locked first, as every writer of its log holds it until commit
	// (so the log's order is its commit order); then the task's row
	// share-locked, which in READ COMMITTED re-reads its newest version
	// and checks the fence against that rather than against the
	// statement's snapshot, taken before the wait for the conversation's
	// lock (an abort or a take-over that committed meanwhile fences the
	// entry off). The uncorrelated EXISTS runs once before the task is
	// read, so the locks come in the engine's order. No row comes back
	// when it was fenced off.
	qAppendProgress = define(`WITH c AS (
			SELECT id FROM {schema}.conversations WHERE id = $1 FOR NO KEY UPDATE),
		t AS (
			SELECT t.id, t.conversation_id FROM {schema}.tasks t
			WHERE t.id = $2 AND t.conversation_id = $1 AND EXISTS (SELECT 1 FROM c)
			  AND t.token = $3 AND t.status = 'running' AND NOT t.abort_requested
			FOR SHARE OF t)
		INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name, payload)
		SELECT t.conversation_id, t.id, 'progress', nullif($4::text, ''), $5 FROM t RETURNING seq`)

	qSettleTask = define(logged(`UPDATE {schema}.tasks t
		SET status = $2, result = coalesce($3, result), error = coalesce($4, error),
		    settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE t.id = $1 AND t.conversation_id = $5`, "t", "{task_columns}", ""))

	// A failure settles with its error in the error history, in the same
	// statement: a settled row can never be written again.
	qSettleFailedTask = define(logged(`UPDATE {schema}.tasks t
		SET status = $2, error = $3,
		    settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
		    `+fmt.Sprintf(historyAppend, 4, 5)+`
		WHERE t.id = $1 AND t.conversation_id = $6`, "t", "{task_columns}", ""))

	qHoldTask = define(logged(`UPDATE {schema}.tasks t
		SET status = $2, result = $3, token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE t.id = $1 AND t.conversation_id = $4`, "t", "{task_columns}", ""))

	qWaitTask = define(logged(`UPDATE {schema}.tasks t
		SET status = $2, phase = $3, state = $4, wait_policy = $5, wait_ids = $6,
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE t.id = $1 AND t.conversation_id = $7`, "t", "{task_columns}", ""))

	qWakeTask = define(logged(`UPDATE {schema}.tasks t SET status = $2, updated_at = now()
		WHERE t.id = $1 AND t.conversation_id = $3`, "t", "{task_columns}", ""))

	qRecoverTasks = define(logged(`UPDATE {schema}.tasks t
		SET status = $2, attempt = attempt + CASE WHEN $3 THEN 1 ELSE 0 END,
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE id = ANY($1) AND status = 'running'`, "t", "id", "ORDER BY id"))
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
		micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline, nullJSON(p.Trace)))
}

// CreateRoot creates a root task, and its conversation on first use, in
// one statement (see qCreateRoot); ok is false, with nothing written, when
// the caller must take the transaction path.
func (s *Store) CreateRoot(ctx context.Context, db DB, p InsertParams) (t arbortype.Task, ok bool, err error) {
	t, err = scanTask(db.QueryRow(ctx, s.sql[qCreateRoot], p.ConversationID, p.OwnerID, p.Kind, p.Background,
		nullJSON(p.Input), p.RestartLimit, p.AbandonOnRestart, p.MaxRetries, p.IdempotencyKey,
		micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline, nullJSON(p.Trace)))
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
