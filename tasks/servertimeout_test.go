package tasks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// waitFor polls cond until it holds; the bound is for a broken test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(20 * time.Millisecond)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// A role whose idle_session_timeout (57P05) is shorter than the time its
// pool's connections sit idle: the server ends a session between two
// operations, and the next operation on it learns so from the server's
// FATAL (issue 38: not retried, it was arbortype.ErrDatabase). The session ended
// before the statement was sent, so nothing of it ran: a transaction, a
// read and an abort are all run again on a new connection.
func TestIdleSessionTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema := testdb.Shared(t)
	cfg := testdb.RoleWith(t, admin, map[string]string{"idle_session_timeout": "200ms"})
	// One connection, handed out as it is (pgxpool pings only one idle for
	// over a second): the next operation gets the session the server ended.
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	role := cfg.ConnConfig.User
	ended := func() {
		t.Helper()
		waitFor(t, "the server to end the role's idle session", func() bool {
			return count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role) == 0
		})
	}

	ended()
	task, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "turn"})
	require.NoError(t, err, "a transaction begun on a session the server ended")
	require.True(t, created)
	ended()
	got, err := eng.Get(ctx, task.ID)
	require.NoError(t, err, "a read on a session the server ended")
	require.Equal(t, arbortype.StatusPending, got.Status)
	ended()
	_, err = eng.Abort(ctx, task.ID)
	require.NoError(t, err, "an abort on a session the server ended")
	got, err = eng.Get(ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusOrphaned, got.Status)
}

// The caller's context ending while an operation waits is the caller's,
// never a server-side timeout to retry, even when the pool is configured
// to end a statement by a cancel request, which the server answers with
// 57014 as it answers its own statement_timeout: the operation returns the
// context's error at once (not arbortype.ErrUnavailable after retries, nor
// arbortype.ErrDatabase as before issue 38 for the cancel request), and nothing was
// written.
func TestContextEndIsNotAServerTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		watcher func(*pgconn.PgConn) ctxwatch.Handler
	}{
		{"pgx's default: a deadline on the connection", nil},
		{"a cancel request", func(conn *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: conn, DeadlineDelay: time.Minute}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin, schema := testdb.Shared(t)
			cfg, err := pgxpool.ParseConfig(testdb.URL(t))
			require.NoError(t, err)
			app := testdb.Name("arbor_app")
			cfg.ConnConfig.RuntimeParams["application_name"] = app
			if c.watcher != nil {
				cfg.ConnConfig.BuildContextWatcherHandler = c.watcher
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			eng, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
			require.NoError(t, err)
			conv := testdb.Conversation(t)
			task, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
			require.NoError(t, err)

			held, err := admin.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = held.Rollback(ctx) }()
			_, err = held.Exec(ctx, `SELECT 1 FROM `+schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE`, conv)
			require.NoError(t, err)

			abortCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := eng.Abort(abortCtx, task.ID)
				done <- err
			}()
			waitFor(t, "the abort to wait for the conversation's row", func() bool {
				return count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
					AND wait_event_type = 'Lock'`, app) == 1
			})
			cancel()
			err = <-done
			require.ErrorIs(t, err, context.Canceled)
			for _, not := range []error{arbortype.ErrUnavailable, arbortype.ErrDatabase, arbortype.ErrAmbiguous} {
				require.False(t, errors.Is(err, not), "%v is not %v", err, not)
			}
			require.NoError(t, held.Rollback(ctx))
			got, err := eng.Get(ctx, task.ID)
			require.NoError(t, err)
			require.Equal(t, arbortype.StatusPending, got.Status, "nothing was written")
		})
	}
}
