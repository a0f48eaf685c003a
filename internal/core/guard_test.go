package core_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/tasks"
)

// forged is, per column of the tasks table, an SQL expression for a value
// that differs from the current one (and passes the column's own CHECK
// constraints), so that a raw UPDATE changes that column alone.
var forged = map[string]string{
	"id": "id + 1000000", "conversation_id": "conversation_id || 'x'", "owner_task_id": "coalesce(owner_task_id, 0) + 1",
	"kind": "kind || 'x'", "status": "status", "background": "NOT background", "input": `'{"forged": 1}'::jsonb`,
	"phase": "phase || 'x'", "state": `'{"forged": 1}'::jsonb`, "result": `'"forged"'::jsonb`,
	"error": `'{"message": "forged"}'::jsonb`, "attempt": "attempt + 1", "restart_limit": "restart_limit + 1",
	"abandon_on_restart": "NOT abandon_on_restart", "abort_requested": "NOT abort_requested",
	"wait_policy": "CASE WHEN wait_policy = 'fail_fast' THEN 'all_settled' ELSE 'fail_fast' END",
	"wait_ids":    "ARRAY[424242]::bigint[]", "wake_at": "coalesce(wake_at, now()) + interval '1 day'",
	"sleep_seq": "sleep_seq + 1", "max_retries": "max_retries + 1", "retries": "retries + 1",
	"retry_backoff_base": "retry_backoff_base + interval '1 second'", "retry_backoff_cap": "retry_backoff_cap + interval '1 second'",
	"error_history": `'[{"try": 9, "message": "forged"}]'::jsonb`, "wake_job_id": "coalesce(wake_job_id, 0) + 424242",
	"token": "coalesce(token, 0) + 424242", "run_epoch": "coalesce(run_epoch, 0) + 1",
	"lease_expires_at": "coalesce(lease_expires_at, now()) + interval '1 day'",
	"idempotency_key":  "coalesce(idempotency_key, '') || 'x'", "settle_seq": "coalesce(settle_seq, 0) + 424242",
	"created_at": "created_at - interval '1 day'", "updated_at": "updated_at + interval '1 second'",
	"started_at": "coalesce(started_at, now()) - interval '1 day'", "settled_at": "coalesce(settled_at, now()) + interval '1 day'",
	"await_name": "coalesce(await_name, 'x') || 'y'", "await_token": "coalesce(await_token, '') || 'x'",
	"delivered": `'{"forged": 1}'::jsonb`, "deadline": "coalesce(deadline, now()) + interval '1 day'",
	"forked_from": "coalesce(forked_from, 0) + 1",
	"rerun_of":    "coalesce(rerun_of, 0) + 1",
	"trace":       `'{"traceparent": "forged"}'::jsonb`,
	"tenant":      "tenant || 'x'", "priority": "priority + 1", "queue_at": "queue_at - interval '1 day'",
	"queue_expires_at": "coalesce(queue_expires_at, now()) + interval '1 day'",
	"concurrency_key":  "coalesce(concurrency_key, 'k') || 'x'", "slots": "ARRAY['key:forged']",
}

// TestColumnRulesCoverTheTable: the guard's rules name every column of
// the tasks table, and the forging test has a value for each.
func TestColumnRulesCoverTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.pool.Query(b.ctx, `SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'tasks'`, b.schema)
	require.NoError(t, err)
	var cols []string
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		cols = append(cols, c)
	}
	require.NoError(t, rows.Err())
	var ruled []string
	for _, r := range guardrules.ColumnRules() {
		ruled = append(ruled, r.Column)
		require.Contains(t, forged, r.Column)
	}
	slices.Sort(cols)
	slices.Sort(ruled)
	require.Equal(t, cols, ruled)
}

// TestGuardRefusesEveryForgedColumn: for every column, a raw UPDATE that
// changes it alone, on a task whose status it may not change with (every
// status but the ones its rule allows, the status kept), is refused by the
// database, and the row is as it was.
func TestGuardRefusesEveryForgedColumn(t *testing.T) {
	t.Parallel()
	for _, rule := range guardrules.ColumnRules() {
		if rule.Column == "status" || rule.Column == "updated_at" {
			continue // the transition table's own tests; free
		}
		t.Run(rule.Column, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tried := 0
			for _, st := range []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusWaiting,
				arbortype.StatusSleeping, arbortype.StatusCompleting, arbortype.StatusCompleted} {
				if slices.Contains(rule.Changes, [2]arbortype.Status{st, st}) {
					continue // it may change without a status change here (a checkpoint)
				}
				s := reach(t, b, st, false)
				before := b.snapshot(t)
				_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.tasks SET %s = %s WHERE id = $1`, b.schema, rule.Column, forged[rule.Column]), s.task.ID)
				requireGuard(t, err, fmt.Sprintf("%s on a %s task", rule.Column, st))
				require.Equal(t, before, b.snapshot(t), "nothing written")
				tried++
			}
			require.Positive(t, tried)
			_, err := b.engine.AbortConversation(b.ctx, b.conv)
			require.NoError(t, err)
		})
	}
}

// requireGuard fails unless err is one of the guard's refusals.
func requireGuard(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: refused by the database, got %v", what, err)
	// 428C9: id is GENERATED ALWAYS, which PostgreSQL enforces itself.
	require.True(t, strings.HasPrefix(pgErr.Code, "AB") || pgErr.Code == "428C9", "%s: %s (%s)", what, pgErr.Message, pgErr.Code)
}

// TestGuardRefusesForgedHistories: status changes the table allows, but
// with the columns wrong: a recovery that does not count its attempt or
// counts two, a start reusing no token, a retry counting two, a settle
// without its number, a run left holding its token after it ended.
func TestGuardRefusesForgedHistories(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		from arbortype.Status
		set  string
	}{
		{"recovery counting two attempts", arbortype.StatusRunning, "status = 'pending', attempt = attempt + 2, token = NULL, run_epoch = NULL, lease_expires_at = NULL"},
		{"a run ended keeping its token", arbortype.StatusRunning, "status = 'pending', attempt = attempt + 1, run_epoch = NULL, lease_expires_at = NULL"},
		{"a start without a token", arbortype.StatusPending, "status = 'running', run_epoch = 1, lease_expires_at = now(), started_at = now()"},
		{"a start without a run epoch", arbortype.StatusPending, "status = 'running', token = 424242, lease_expires_at = now(), started_at = now()"},
		{"a sleep keeping its number", arbortype.StatusRunning, "status = 'sleeping', wake_at = now(), token = NULL, run_epoch = NULL, lease_expires_at = NULL"},
		{"a retry counting two", arbortype.StatusRunning, "status = 'sleeping', retries = retries + 2, sleep_seq = sleep_seq + 1, wake_at = now(), token = NULL, run_epoch = NULL, lease_expires_at = NULL"},
		{"a settle without its number", arbortype.StatusRunning, "status = 'completed', settled_at = now(), token = NULL, run_epoch = NULL, lease_expires_at = NULL"},
		{"a completion changing the input", arbortype.StatusRunning, `status = 'completed', input = '1', settled_at = now(), settle_seq = 424242, token = NULL, run_epoch = NULL, lease_expires_at = NULL`},
		{"a wait rewriting the attempt", arbortype.StatusRunning, "status = 'waiting', attempt = attempt + 1, wait_policy = 'all_settled', wait_ids = '{}', token = NULL, run_epoch = NULL, lease_expires_at = NULL"},
		{"an abort mark on a live task", arbortype.StatusPending, "abort_requested = true"},
		{"a wake job moved under a sleeping task", arbortype.StatusSleeping, "wake_job_id = wake_job_id + 1"},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			s := reach(t, b, c.from, false)
			before := b.snapshot(t)
			_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.tasks SET %s WHERE id = $1`, b.schema, c.set), s.task.ID)
			requireGuard(t, err, c.name)
			require.Equal(t, before, b.snapshot(t), "nothing written")
			_, err = b.engine.AbortConversation(b.ctx, b.conv)
			require.NoError(t, err)
		})
	}
}

// TestGuardRefusesForgedInserts: a task is inserted only as the engine
// creates one — pending, never run, no history — each column tried.
func TestGuardRefusesForgedInserts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.root(t, "turn") // the conversation row
	before := b.snapshot(t)
	for col, val := range map[string]string{
		"status": "'running'", "token": "7", "run_epoch": "1", "lease_expires_at": "now()", "started_at": "now()",
		"settled_at": "now()", "settle_seq": "99", "attempt": "99", "retries": "1", "sleep_seq": "1",
		"abort_requested": "true", "phase": "'p'", "state": "'{}'", "result": "'1'", "error": `'{"message": "x"}'`,
		"error_history": `'[{"try": 1}]'`, "wait_policy": "'all_settled'", "wait_ids": "'{1}'", "wake_at": "now()", "wake_job_id": "1",
		"await_name": "'approval'", "await_token": "'awt_x'", "delivered": `'{"name": "x"}'`,
	} {
		_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %s.tasks (conversation_id, kind, %s) VALUES ($1, 'k', %s)`, b.schema, col, val), b.conv)
		requireGuard(t, err, "insert with "+col)
	}
	require.Equal(t, before, b.snapshot(t), "nothing inserted")
	_, err := b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// TestGuardRefusesDeletes: no task is ever deleted, live or settled (a
// later issue's pruning will be the one path that may), the table is never
// truncated, and a conversation row is never deleted.
func TestGuardRefusesDeletes(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	live := reach(t, b, arbortype.StatusRunning, false).task
	done := reach(t, b, arbortype.StatusCompleted, false).task
	before := b.snapshot(t)
	for _, id := range []int64{live.ID, done.ID} {
		_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`DELETE FROM %s.tasks WHERE id = $1`, b.schema), id)
		requireGuard(t, err, fmt.Sprintf("delete of task %d", id))
	}
	_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`TRUNCATE %s.tasks CASCADE`, b.schema))
	requireGuard(t, err, "truncate")
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`DELETE FROM %s.conversations WHERE id = $1`, b.schema), b.conv)
	requireGuard(t, err, "delete of a conversation")
	require.Equal(t, before, b.snapshot(t), "nothing deleted")
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// TestGuardRefusesForgedLeases: a conversation's epoch only grows, by one,
// with a new holder; a holder always has a deadline; its id never changes;
// it is inserted free and stamped now.
// A fence forged backwards would let a former holder write again.
func TestGuardRefusesForgedLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.root(t, "turn")
	b.lease(t)
	var forger int64
	require.NoError(t, b.pool.QueryRow(b.ctx, fmt.Sprintf(`INSERT INTO %s.holders (name, expires_at) VALUES ('forger', now() + interval '1 hour') RETURNING id`,
		b.schema)).Scan(&forger))
	before := b.snapshot(t)
	for what, set := range map[string]string{
		"an epoch moved back":           "epoch = epoch - 1",
		"an epoch skipping ahead":       "epoch = epoch + 2",
		"an epoch moved with no holder": "epoch = epoch + 1, holder = NULL, holder_id = NULL",
		"a holder name without a row":   "holder_id = NULL",
		"a holder row without a name":   "holder = NULL",
		"a holder renamed in place":     "holder = 'other'",
		"a holder changed in place":     fmt.Sprintf("holder_id = %d", forger),
		"an id changed":                 "id = id || 'x'",
	} {
		_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.conversations SET %s WHERE id = $1`, b.schema, set), b.conv)
		requireGuard(t, err, what)
	}
	_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %s.conversations (id, epoch) VALUES ($1, 5)`, b.schema), b.conv+"-forged")
	requireGuard(t, err, "a conversation inserted at a forged epoch")
	// Issue 24: a birth of the writer's choosing (a wall-time budget's
	// spend, and the prune's cutoff, are measured from it).
	for _, at := range []string{"2400-01-01", "2000-01-01"} {
		_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %s.conversations (id, created_at) VALUES ($1, $2)`, b.schema), b.conv+"-forged", at)
		requireGuard(t, err, "a conversation inserted born "+at)
	}
	require.Equal(t, before, b.snapshot(t), "nothing written")
	// Migration 029 (issue 24): the lease changes hands only as arbor's
	// paths change it. Taken by hand from the live holder, or released by
	// hand with a task running, another node could claim a task whose run
	// the live holder's handler is still making.
	takeOver := fmt.Sprintf(`WITH h AS (INSERT INTO %[1]s.holders (name, expires_at) VALUES ('other', now() + interval '1 minute') RETURNING id)
		UPDATE %[1]s.conversations SET holder = 'other', holder_id = (SELECT id FROM h), epoch = epoch + 1 WHERE id = $1`, b.schema)
	_, err = b.pool.Exec(b.ctx, takeOver, b.conv)
	requireGuard(t, err, "a conversation taken from its live holder")
	turn := b.start(t, b.root(t, "turn").ID)
	before = b.snapshot(t)
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.conversations SET holder = NULL, holder_id = NULL WHERE id = $1`, b.schema), b.conv)
	requireGuard(t, err, "a conversation released with a task running")
	require.Equal(t, before, b.snapshot(t), "nothing written")
	// The engine's own take-over passes: epoch + 1 with a new holder, once
	// the holder's row has expired (written with the triggers off: the
	// holders' guard never brings a deadline back); and a release with
	// nothing running. (The engine's take-over recovers the runs in the
	// same transaction; the run here ends first, so that the hand-written
	// one leaves nothing to recover.)
	_, err = b.engine.Complete(b.ctx, turn.ID, turn.Token, nil)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, fmt.Sprintf(`UPDATE %[1]s.holders SET expires_at = now() - interval '1 second'
			WHERE id = (SELECT holder_id FROM %[1]s.conversations WHERE id = $1)`, b.schema), b.conv)
		return err
	}))
	_, err = b.pool.Exec(b.ctx, takeOver, b.conv)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.conversations SET holder = NULL, holder_id = NULL WHERE id = $1`, b.schema), b.conv)
	require.NoError(t, err)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// TestGuardRefusesForgedEdges (issue 24): what the guard let through.
//   - A DELETE of an old settled turn, by a connection that never set
//     arbor.prune (the setting is then NULL, and NOT (NULL = 'on') raised
//     nothing): refused, whatever else about the turn would allow a prune.
//   - An approval forged by hand: an awaiting task woken with a delivered
//     payload no emit made, or a "timeout" that carries one: refused; the
//     engine's own delivery passes.
//   - A child inserted under an owner that settled, or one that is
//     completing; a row inserted with a created_at of its writer's choosing.
func TestGuardRefusesForgedEdges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.start(t, b.root(t, "turn").ID)
	_, err := b.engine.Complete(b.ctx, old.ID, old.Token, nil)
	require.NoError(t, err)
	newer := b.start(t, b.root(t, "turn").ID)
	_, err = b.engine.Complete(b.ctx, newer.ID, newer.Token, nil)
	require.NoError(t, err)

	awaiting := b.start(t, b.root(t, "approve").ID)
	_, err = b.engine.AwaitEvent(b.ctx, awaiting.ID, awaiting.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	before := b.snapshot(t)

	conn, err := b.pool.Acquire(b.ctx) // a fresh session: arbor.prune never set on it
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `RESET ALL`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, fmt.Sprintf(`DELETE FROM %s.tasks WHERE id = $1`, b.schema), old.ID)
	conn.Release()
	requireGuard(t, err, "an unmarked delete of an old settled turn")

	for what, delivered := range map[string]string{
		"an approval no emit made":     `{"name": "approval", "event_id": 424242, "payload": {"approved": true}}`,
		"a timeout carrying a payload": `{"name": "approval", "timed_out": true, "payload": {"approved": true}}`,
		"a malformed event id":         `{"name": "approval", "event_id": "x"}`,
	} {
		_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %s.tasks SET status = 'pending', delivered = $2::jsonb, wake_at = NULL, wake_job_id = NULL WHERE id = $1`,
			b.schema), awaiting.ID, delivered)
		requireGuard(t, err, what)
	}

	for what, owner := range map[string]int64{"a settled owner": old.ID} {
		_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %s.tasks (conversation_id, owner_task_id, kind) VALUES ($1, $2, 'k')`, b.schema), b.conv, owner)
		requireGuard(t, err, "a child of "+what)
	}
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %s.tasks (conversation_id, kind, created_at) VALUES ($1, 'k', '2400-01-01')`, b.schema), b.conv)
	requireGuard(t, err, "a created_at of the writer's choosing")
	require.Equal(t, before, b.snapshot(t), "nothing written")

	// The engine's own delivery passes.
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: awaiting.ID, Name: "approval", Payload: []byte(`{"approved": true}`)})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, b.get(t, awaiting.ID).Status)
	b.requireInvariants(t)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}
