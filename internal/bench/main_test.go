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

// TestMain fails the package if goroutines outlive its tests, or if a run
// kept the schema it was lent. Each run of a test's measurements takes a
// schema testdb recycles, emptied (see testdb.Schema), rather than
// migrating one.
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
	os.Exit(code)
}
