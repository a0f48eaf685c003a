package testdb

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestProxyBlackhole: while the route is blackholed, a query on an open
// connection and a new connection are held, not answered and not refused;
// at Heal both go through — the query runs on the server after the heal,
// on the same connection (nothing was closed), and the new connection's
// backend starts after it. The proxy is on a Unix socket, so the server
// reads this process's clock.
func TestProxyBlackhole(t *testing.T) {
	t.Parallel()
	proxy, url := StartProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

	proxy.Blackhole()
	type result struct {
		at  time.Time
		pid int
		err error
	}
	queried, connected := make(chan result, 1), make(chan result, 1)
	go func() {
		var r result
		r.err = conn.QueryRow(ctx, `SELECT clock_timestamp(), pg_backend_pid()`).Scan(&r.at, &r.pid)
		queried <- r
	}()
	go func() {
		var r result
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			connected <- result{err: err}
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		r.err = c.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&r.at)
		connected <- r
	}()
	// Both are held: the query's message, and the new connection's dial.
	for proxy.Held() < 1 || proxy.Stalled() < 2 {
		require.NoError(t, ctx.Err(), "held %d, stalled %d", proxy.Held(), proxy.Stalled())
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-queried:
		t.Fatalf("a query was answered through a blackhole: %+v", r)
	case r := <-connected:
		t.Fatalf("a connection went through a blackhole: %+v", r)
	default:
	}
	healed := time.Now()
	proxy.Heal()
	q := <-queried
	require.NoError(t, q.err)
	require.Equal(t, pid, q.pid, "the same connection, never closed")
	require.True(t, q.at.After(healed), "the query ran on the server after the heal (%s), at %s", healed, q.at)
	c := <-connected
	require.NoError(t, c.err)
	require.True(t, c.at.After(healed), "the new connection's backend started after the heal (%s), at %s", healed, c.at)
}
