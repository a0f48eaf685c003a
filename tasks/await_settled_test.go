package tasks_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestAwaitSettledTrustsTheRowNotTheLog: a settle's entry written into
// the conversation log by hand, for a task that is still running, does
// not end AwaitSettled; the task's real settle does, and AwaitSettled
// returns the settled row.
//
// Deterministic: the test holds the tasks table locked while it forges
// the entry, so that the awaiter, having read the entry, blocks on its
// read of the row (seen in pg_stat_activity); the lock is released with
// nothing changed, the test waits for that read to end, and only then
// settles the task.
func TestAwaitSettledTrustsTheRowNotTheLog(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	ctx := context.Background()
	engine := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	conv := testdb.Conversation(t)
	task, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	run, err := engine.Start(ctx, task.ID)
	require.NoError(t, err)

	// The awaiter has a pool of its own, named, to be found in
	// pg_stat_activity.
	app := testdb.Name("awaiter")
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	apool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(apool.Close)
	awaiter, err := tasks.New(ctx, apool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	type result struct {
		t   arbortype.Task
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := awaiter.AwaitSettled(actx, task.ID)
		done <- result{got, err}
	}()
	// Once it LISTENs it follows the log from a cursor taken before: an
	// entry committed now is one it reads.
	until(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, app)

	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE `+schema+`.tasks IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	// The log's INSERT guard would refuse the forged entry (and wait for
	// the lock to read the task): it is written with the triggers off, as
	// a superuser restoring a dump could.
	forge, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = forge.Rollback(ctx) }()
	_, err = forge.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err, "the test forges with the triggers off (a superuser's session_replication_role)")
	_, err = forge.Exec(ctx, `INSERT INTO `+schema+`.conversation_log (conversation_id, task_id, kind, status, name)
		VALUES ($1, $2, 'status', 'completed', 'turn')`, conv, task.ID)
	require.NoError(t, err)
	require.NoError(t, forge.Commit(ctx))
	var pid int
	untilRow(t, pool, &pid, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app)
	require.NoError(t, lock.Rollback(ctx))
	// The awaiter's read of the row, which saw it running, is over.
	until(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'idle'`, pid)
	select {
	case r := <-done:
		t.Fatalf("AwaitSettled returned on a forged entry: status %s, error %v", r.t.Status, r.err)
	default:
	}

	_, err = engine.Complete(ctx, task.ID, run.Token, json.RawMessage(`{"ok": true}`))
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, arbortype.StatusCompleted, r.t.Status)
	require.JSONEq(t, `{"ok": true}`, string(r.t.Result))
}

// until polls query (a count) until it is at least 1.
func until(t *testing.T, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	var n int
	untilRow(t, pool, &n, `SELECT n FROM (`+query+`) AS c(n) WHERE n > 0`, args...)
}

// untilRow polls query until it returns a row, scanned into dest.
func untilRow(t *testing.T, pool *pgxpool.Pool, dest any, query string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		err := pool.QueryRow(ctx, query, args...).Scan(dest)
		if err == nil {
			return
		}
		require.ErrorContains(t, err, "no rows", "polling %s", query)
		select {
		case <-ctx.Done():
			t.Fatalf("never true: %s", query)
		case <-time.After(2 * time.Millisecond):
		}
	}
}
