package testdb

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvPgBouncerURL names the variable that holds the URL of a PgBouncer in
// transaction mode in front of the test database (scripts/with-postgres.sh
// starts one and sets it, so `make test` has it).
const EnvPgBouncerURL = "ARBOR_PGBOUNCER_URL"

// PgBouncerPool opens a pool through the PgBouncer of ARBOR_PGBOUNCER_URL,
// closed when the test ends, configured as docs/scaling.md says: pgx's
// QueryExecModeExec, since PgBouncer 1.18 keeps no prepared statements
// across transactions. appName is the pool's application_name, by which a
// test tells its connections in pg_stat_activity. Without the variable the
// test is skipped, saying so loudly.
func PgBouncerPool(tb testing.TB, appName string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(PgBouncerURL(tb))
	if err != nil {
		tb.Fatalf("parse %s: %v", EnvPgBouncerURL, err)
	}
	cfg.MaxConns = 10
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("connect to %s: %v", EnvPgBouncerURL, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// PgBouncerURL returns ARBOR_PGBOUNCER_URL, or skips the test, saying
// loudly that arbor is not tested through PgBouncer and how to make it so.
func PgBouncerURL(tb testing.TB) string {
	tb.Helper()
	url := os.Getenv(EnvPgBouncerURL)
	if url == "" {
		tb.Skipf("SKIPPED: %s is not set, so arbor is NOT tested through PgBouncer: run the tests with `make test` "+
			"(scripts/with-postgres.sh starts a PgBouncer in transaction mode and sets it), or set %s to one in front of %s",
			EnvPgBouncerURL, EnvPgBouncerURL, EnvURL)
	}
	return url
}

// NamedPool opens a pool on the test database (directly, not through a
// PgBouncer) whose connections carry application_name appName, closed when
// the test ends.
func NamedPool(tb testing.TB, appName string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("parse %s: %v", EnvURL, err)
	}
	cfg.MaxConns = 10
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
