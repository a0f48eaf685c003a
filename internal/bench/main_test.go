package bench

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestMain fails the package if goroutines outlive its tests, if a run
// kept the schema it was lent, or if a schema of the harness's own (a
// DBOS or go-workflows run's, pg_walinspect's) was left behind once every
// test ended: the tests run side by side, so only then is nothing expected
// to hold one.
// Each run of a test's measurements takes a schema testdb recycles,
// emptied (see testdb.Schema), rather than migrating one.
func TestMain(m *testing.M) {
	var lent atomic.Int64
	lendSchema = func(_ context.Context, pool *pgxpool.Pool) (string, func(), error) {
		schema, giveBack, err := testdb.Lend(pool)
		if err != nil {
			return "", nil, err
		}
		lent.Add(1)
		return schema, func() { lent.Add(-1); giveBack() }, nil
	}
	code := testdb.Main(m)
	if n := lent.Load(); n != 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "bench: %d schemas lent to runs were not handed back\n", n)
		code = 1
	}
	if url := os.Getenv(testdb.EnvURL); url != "" && code == 0 {
		if left, err := schemasLeft(url); err != nil || left != 0 {
			fmt.Fprintf(os.Stderr, "bench: %d schemas of the harness left behind (%v)\n", left, err)
			code = 1
		}
	}
	os.Exit(code)
}

// schemasLeft counts the schemas named as the harness names its own.
func schemasLeft(url string) (int, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var left int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'arbor\_bench\_%' OR nspname LIKE 'dbos\_bench\_%' OR nspname LIKE 'gowf\_bench\_%'`).Scan(&left)
	return left, err
}
