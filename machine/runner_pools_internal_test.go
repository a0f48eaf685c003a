package machine

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// The pools a runner makes run with PostgreSQL's JIT off (an open over a
// backlog was compiled for 569 ms of its 694 ms), after the application
// pool's own AfterConnect, which still runs; the application's pool is
// left as it is. Through a transaction pooler nothing is SET: a session's
// setting would outlive the session.
func TestRunnerPoolsTurnJITOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	var appHook atomic.Int32
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		appHook.Add(1)
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, schema := testdb.Shared(t)
	jitOf := func(p *pgxpool.Pool) string {
		var v string
		require.NoError(t, p.QueryRow(ctx, `SHOW jit`).Scan(&v))
		return v
	}
	appJIT := jitOf(pool)

	for _, pooler := range []bool{false, true} {
		eng := enginetest.New(t, pool, &tasks.Config{Schema: schema, TransactionPooler: pooler})
		p, err := newRunnerPools(ctx, eng.C, (&RunnerConfig{}).WithDefaults())
		require.NoError(t, err)
		want := "off"
		if pooler {
			want = appJIT
		}
		before := appHook.Load()
		for name, rp := range map[string]*pgxpool.Pool{"work": p.work, "renew": p.renew, "control": p.control, "announce": p.announce} {
			require.Equal(t, want, jitOf(rp), "the %s pool's jit (transaction pooler: %v)", name, pooler)
		}
		require.Greater(t, appHook.Load(), before, "the application pool's AfterConnect still runs on the runner's connections")
		p.close()
	}
	require.Equal(t, appJIT, jitOf(pool), "the application's pool is left as it is")
}

// A runner's announcements (a flush's log, a claim's runs, a handler's
// progress entry: sent after their commits) go on the runner's announce
// connection, not its work pool: with every connection of the work pool
// taken, a follower still gets the news. Sent on the work pool, they waited
// for it (bench (i): 90–235 ms while the pool opened a connection, stream
// p99 126–140 ms), and here the send would wait until its timeout and be
// lost.
func TestRunnerAnnouncesOnItsOwnConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	work := testdb.SmallPool(t, 2)
	ir := startInternalRunner(t, map[string]Handler{"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) }}, func(c *RunnerConfig) { c.Pool = work })

	listener, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	channel := ir.r.core.Store.LogChannel()
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	// Every connection of the work pool taken (and kept) by the test.
	var held []*pgxpool.Conn
	for len(held) < int(work.Config().MaxConns) {
		c, err := work.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	t.Cleanup(func() {
		for _, c := range held {
			c.Release()
		}
	})

	ir.r.core.AnnounceLog(ir.conv)
	waitCtx, cancel := context.WithTimeout(ctx, eventually)
	defer cancel()
	n, err := listener.WaitForNotification(waitCtx)
	require.NoError(t, err, "the announcement came while the work pool was taken")
	require.Equal(t, channel, n.Channel)
	require.Equal(t, ir.conv, n.Payload)
}
