package arbortest_test

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n))
	return n == 1
}

// A test's schema is migrated, its own, and gone when the test ends, also
// when the test closed its pool first.
func TestSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	var (
		mu    sync.Mutex
		names []string
	)
	t.Run("group", func(t *testing.T) {
		for _, closePool := range []bool{false, true} {
			t.Run("", func(t *testing.T) {
				t.Parallel()
				own := pool
				if closePool {
					own = testdb.NewPool(t)
				}
				schema := arbortest.Schema(t, own)
				if closePool {
					t.Cleanup(own.Close) // runs before the drop
				}
				mu.Lock()
				names = append(names, schema)
				mu.Unlock()
				require.True(t, schemaExists(t, pool, schema))
				engine, err := tasks.New(t.Context(), own, &tasks.Config{Schema: schema})
				require.NoError(t, err)
				_, _, err = engine.Create(t.Context(), arbortype.CreateParams{ConversationID: "c", Kind: "turn"})
				require.NoError(t, err, "the schema is migrated")
			})
		}
	})
	require.Len(t, names, 2)
	require.NotEqual(t, names[0], names[1])
	for _, s := range names {
		require.False(t, schemaExists(t, pool, s), "schema %s was dropped", s)
	}
}

func TestEngineRefuses(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	f := &fakeTB{TB: t}
	require.Nil(t, arbortest.Engine(f, pool, &tasks.Config{Schema: "public"}))
	f.requireFailed(t, `Config.Schema is "public"`)
	require.Empty(t, arbortest.Schema(f, nil))
	f.requireFailed(t, "pool is nil")
	require.Nil(t, arbortest.Engine(f, nil, nil))
	f.requireFailed(t, "pool is nil")
}

// Database gives a test a pool on $ARBOR_DATABASE_URL and a migrated
// schema of its own; when the test ends the schema is gone and the pool
// closed.
func TestDatabase(t *testing.T) {
	t.Parallel()
	observer := testdb.NewPool(t)
	var (
		pool   *pgxpool.Pool
		schema string
	)
	t.Run("group", func(t *testing.T) {
		t.Run("test", func(t *testing.T) {
			t.Parallel()
			pool, schema = arbortest.Database(t)
			require.True(t, schemaExists(t, observer, schema))
			engine, err := tasks.New(t.Context(), pool, &tasks.Config{Schema: schema})
			require.NoError(t, err)
			_, _, err = engine.Create(t.Context(), arbortype.CreateParams{ConversationID: "c", Kind: "turn"})
			require.NoError(t, err, "the schema is migrated")
		})
	})
	require.False(t, schemaExists(t, observer, schema), "schema %s was dropped", schema)
	require.Error(t, pool.Ping(t.Context()), "the pool was closed")
}

// With $ARBOR_DATABASE_URL unset, Database fails the test saying what to
// set. (Not parallel: it changes the process's environment.)
func TestDatabaseNeedsTheURL(t *testing.T) {
	t.Setenv(arbortest.DatabaseURLEnv, "")
	f := &fakeTB{TB: t}
	pool, schema := arbortest.Database(f)
	require.Nil(t, pool)
	require.Empty(t, schema)
	f.requireFailed(t, "ARBOR_DATABASE_URL is not set")
}
