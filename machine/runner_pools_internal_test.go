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
		for name, rp := range map[string]*pgxpool.Pool{"work": p.work, "renew": p.renew, "control": p.control} {
			require.Equal(t, want, jitOf(rp), "the %s pool's jit (transaction pooler: %v)", name, pooler)
		}
		require.Greater(t, appHook.Load(), before, "the application pool's AfterConnect still runs on the runner's connections")
		p.close()
	}
	require.Equal(t, appJIT, jitOf(pool), "the application's pool is left as it is")
}
