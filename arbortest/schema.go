package arbortest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// DatabaseURLEnv names the environment variable Database reads the test
// database's URL from: the one arbor's own tests and `make test` use.
const DatabaseURLEnv = "ARBOR_DATABASE_URL"

// Database gives a test a pool on the database named by $ARBOR_DATABASE_URL
// (DatabaseURLEnv) and a migrated schema of the test's own in it (see
// Schema), for an engine, a Runner and the test's own rows:
//
//	pool, schema := arbortest.Database(t)
//	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
//
// When the test ends the schema is dropped, then the pool closed, after
// the cleanups registered later (a Runner stopped with tb.Cleanup stops
// first). With the variable unset it fails the test saying so; the
// database must let the test's role create schemas. The pool has pgxpool's
// defaults, which are enough: a Runner makes pools of its own.
func Database(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	url := os.Getenv(DatabaseURLEnv)
	if url == "" {
		tb.Fatalf("arbortest.Database: %s is not set: point it at a PostgreSQL database the tests may create schemas in", DatabaseURLEnv)
		return nil, ""
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("arbortest.Database: %s: %v", DatabaseURLEnv, err)
		return nil, ""
	}
	tb.Cleanup(pool.Close)
	return pool, Schema(tb, pool)
}

// Schema creates a schema of the test's own in pool's database, named
// arbor_test_… and migrated (arbor's tables and River's), and drops it when
// the test ends, after the cleanups registered later (stop a Runner with
// tb.Cleanup after Schema, and it stops first). It is dropped on a
// connection of its own if the pool was closed by then. Names are random,
// so parallel tests, and test binaries sharing one database, never meet.
// The caller owns the pool.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	if pool == nil {
		tb.Fatalf("arbortest.Schema: the pool is nil")
		return ""
	}
	return testdb.Dropped(tb, pool)
}

// Engine returns an engine on a schema of the test's own (see Schema),
// configured by cfg (nil for the defaults). cfg.Schema must be empty: the
// engine's schema is the new one.
func Engine(tb testing.TB, pool *pgxpool.Pool, cfg *tasks.Config) *tasks.Engine {
	tb.Helper()
	var conf tasks.Config
	if cfg != nil {
		conf = *cfg
	}
	if conf.Schema != "" {
		tb.Fatalf("arbortest.Engine: Config.Schema is %q: leave it empty, the engine's schema is one of the test's own", conf.Schema)
		return nil
	}
	schema := Schema(tb, pool)
	if schema == "" {
		return nil
	}
	conf.Schema = schema
	engine, err := tasks.New(context.Background(), pool, &conf)
	if err != nil {
		tb.Fatalf("arbortest.Engine: %v", err)
		return nil
	}
	return engine
}
