package bench

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestMain fails the package if goroutines outlive its tests. Each run
// of a test's measurements takes a schema testdb recycles, emptied (see
// testdb.Schema), rather than migrating one.
func TestMain(m *testing.M) {
	lendSchema = func(_ context.Context, pool *pgxpool.Pool) (string, func(), error) { return testdb.Lend(pool) }
	os.Exit(testdb.Main(m))
}
