package notify_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/notify"
	"github.com/arborhq/arbor/internal/testdb"
)

// listeners counts the backends whose last statement LISTENed or UNLISTENed
// on a channel named prefix…: the listener sends nothing else.
func listeners(t *testing.T, ctx context.Context, pool *pgxpool.Pool, prefix string) []int {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE query ~ ('^(UN)?LISTEN "' || $1)`, prefix)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return pids
}

// TestSubscribersShareOneBackend: three subscribers of one pool (as the
// runner's change channel, the waker's sleep channel and the followers' log
// channel are) are heard on one backend, which LISTENs on all their
// channels.
func TestSubscribersShareOneBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	prefix := testdb.Name("notify_share")
	heard := make(chan string, 3)
	for _, ch := range []string{prefix + "_a", prefix + "_b", prefix + "_c"} {
		listening := make(chan struct{}, 1)
		s := notify.Subscribe(pool, slog.Default(), []string{ch}, func() { listening <- struct{}{} },
			func(n *pgconn.Notification) { heard <- n.Channel })
		t.Cleanup(s.Unsubscribe)
		<-listening
	}
	for _, ch := range []string{prefix + "_a", prefix + "_b", prefix + "_c"} {
		_, err := pool.Exec(ctx, "SELECT pg_notify($1, 'x')", ch)
		require.NoError(t, err)
		require.Equal(t, ch, <-heard)
	}
	require.Len(t, listeners(t, ctx, pool, prefix), 1, "one LISTEN backend for the pool's three subscribers")
}

// TestTerminatedListenerIsRecovered: the listener's backend terminated, it
// reconnects and tells its subscriber to re-read (a second onListen), and
// hears what is sent afterwards.
func TestTerminatedListenerIsRecovered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	ch := testdb.Name("notify_recover")
	listening := make(chan struct{}, 4)
	heard := make(chan string, 4)
	s := notify.Subscribe(pool, slog.New(slog.DiscardHandler), []string{ch}, func() { listening <- struct{}{} },
		func(n *pgconn.Notification) { heard <- n.Payload })
	t.Cleanup(s.Unsubscribe)
	<-listening
	pids := listeners(t, ctx, pool, ch)
	require.Len(t, pids, 1)
	_, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pids[0])
	require.NoError(t, err)
	<-listening // the re-read after the reconnect
	_, err = pool.Exec(ctx, "SELECT pg_notify($1, 'after')", ch)
	require.NoError(t, err)
	require.Equal(t, "after", <-heard)
	require.Len(t, listeners(t, ctx, pool, ch), 1)
}

// TestListenerOutlastsTheRolesIdleSessionTimeout: a role with
// idle_session_timeout (issue 38: settings a DBA puts on an application's
// role) does not end the listener's session, idle while it waits: it keeps
// one session, LISTENed once, and hears what is sent.
func TestListenerOutlastsTheRolesIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testdb.NewPool(t)
	cfg := testdb.RoleWith(t, admin, map[string]string{"idle_session_timeout": "200ms"})
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ch := testdb.Name("notify_idle")
	var listens atomic.Int32
	listening := make(chan struct{}, 1)
	heard := make(chan string, 1)
	s := notify.Subscribe(pool, slog.New(slog.DiscardHandler), []string{ch}, func() {
		listens.Add(1)
		select {
		case listening <- struct{}{}:
		default:
		}
	}, func(n *pgconn.Notification) { heard <- n.Payload })
	t.Cleanup(s.Unsubscribe)
	<-listening
	deadline := time.Now().Add(45 * time.Second)
	for {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1
			AND query ~ ('^LISTEN "' || $2) AND state = 'idle' AND now() - state_change > interval '600 ms'`,
			cfg.ConnConfig.User, ch).Scan(&n))
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "timed out waiting for the listener to sit idle past the role's idle_session_timeout")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, int32(1), listens.Load(), "one session, LISTENed once")
	_, err = admin.Exec(ctx, "SELECT pg_notify($1, 'idle')", ch)
	require.NoError(t, err)
	require.Equal(t, "idle", <-heard)
}
