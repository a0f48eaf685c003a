// Package testdb gives tests a real PostgreSQL: the database named by
// ARBOR_DATABASE_URL (which `make test` sets to a throwaway server it
// starts), a migrated schema of their own, and nothing else. It never drops
// anything but the schemas it created. Its Schema is also the one behind
// the users' arbortest.Schema.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/migrations"
)

// EnvURL names the variable that holds the database URL.
const EnvURL = "ARBOR_DATABASE_URL"

var (
	mu     sync.Mutex
	shared struct {
		pool   *pgxpool.Pool
		schema string
	}
)

// URL returns the database URL, or fails the test with what to do.
func URL(tb testing.TB) string {
	tb.Helper()
	url, err := urlFromEnv()
	if err != nil {
		tb.Fatal(err)
	}
	return url
}

func urlFromEnv() (string, error) {
	url := os.Getenv(EnvURL)
	if url == "" {
		return "", fmt.Errorf("%s is not set: run the tests with `make test`, which starts a throwaway PostgreSQL, or set %s to a database the tests may create schemas in", EnvURL, EnvURL)
	}
	return url, nil
}

// Main runs a test package's tests, drops the shared schema and the
// recycled ones afterwards (see Schema), and fails the package if goroutines outlive its tests (a runner, a waker, a
// River client or a LISTEN loop left running, a pool left open): their
// stacks are printed. Use it from TestMain: os.Exit(testdb.Main(m)).
func Main(m *testing.M) int {
	recycling()
	code := m.Run()
	dropSpares()
	mu.Lock()
	if shared.pool != nil {
		dropSchema(shared.pool, shared.schema)
		shared.pool.Close()
		shared.pool = nil
	}
	mu.Unlock()
	if leaks := leakedGoroutines(10 * time.Second); len(leaks) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "testdb: %d goroutines outlived the tests:\n\n%s\n", len(leaks), strings.Join(leaks, "\n\n"))
		return 1
	}
	return code
}

// leakedGoroutines waits up to bound for every goroutine but the caller's
// and the runtime's own to end, and returns the stacks of those that did
// not.
func leakedGoroutines(bound time.Duration) []string {
	deadline := time.Now().Add(bound)
	for {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		var leaks []string
		for i, g := range strings.Split(string(buf[:n]), "\n\n") {
			if i == 0 || benignGoroutine(g) {
				continue // the first is the caller
			}
			leaks = append(leaks, g)
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benignGoroutine reports whether a goroutine's stack is one the runtime or
// the testing package keeps for the whole process.
func benignGoroutine(stack string) bool {
	for _, s := range []string{
		"os/signal.signal_recv", "os/signal.loop", "runtime.ensureSigM",
		"testing.(*M).startAlarm", "testing.runTests.func", "testing.(*M).Run",
		"runtime.goexit0", "runtime/pprof.",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// Shared returns the package's pool and a migrated schema it shares with the
// package's other tests. Tests isolate themselves by using conversations of
// their own (see Conversation).
func Shared(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if shared.pool == nil {
		pool, err := openPool(URL(tb))
		if err != nil {
			tb.Fatalf("connect: %v", err)
		}
		schema := Name("arbor_test")
		if err := migrate(pool, schema); err != nil {
			pool.Close()
			tb.Fatalf("migrate %s: %v", schema, err)
		}
		shared.pool, shared.schema = pool, schema
	}
	return shared.pool, shared.schema
}

// Fresh returns a pool and a schema of the test's own, migrated, dropped when
// the test ends. For tests that run background goroutines, River clients or
// LISTEN/NOTIFY, whose effects must not reach other tests.
func Fresh(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool := NewPool(tb)
	return pool, Schema(tb, pool)
}

// Schema returns a schema of the test's own on pool, named arbor_test_…,
// migrated (arbor's tables and River's) and empty, that no other test uses
// while this one runs, and drops it when the test ends — on a connection
// of its own if pool was closed by then. Safe for parallel tests: each name
// is random. In a package whose TestMain is Main, the schema may be one an
// earlier test of the package used, emptied, and it goes back for the next
// test rather than being dropped (see recycle.go): a package migrates about
// as many schemas as it runs tests at once.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	schema, giveBack, err := Lend(pool)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(giveBack)
	return schema
}

// Lend is Schema for a harness that needs many schemas in one test, one
// after the other (internal/bench's smoke test measures each run on a
// schema of its own): it returns the schema and the function that hands
// it back, emptied for the next, or drops it; on an error nothing is left.
func Lend(pool *pgxpool.Pool) (string, func(), error) {
	if schema := takeSpare(); schema != "" {
		return schema, func() { release(pool, schema) }, nil
	}
	schema := Name("arbor_test")
	if err := migrate(pool, schema); err != nil {
		dropSchema(pool, schema)
		return "", nil, fmt.Errorf("migrate %s: %w", schema, err)
	}
	remember(pool, schema)
	return schema, func() { release(pool, schema) }, nil
}

// Dropped is Schema without recycling: a schema migrated for the test
// alone, dropped when it ends, as arbortest.Schema promises its users.
func Dropped(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	schema := Name("arbor_test")
	tb.Cleanup(func() { dropSchema(pool, schema) })
	if err := migrate(pool, schema); err != nil {
		tb.Fatalf("migrate %s: %v", schema, err)
	}
	return schema
}

// NewPool opens a pool on the test database, closed when the test ends.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := openPool(URL(tb))
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// SmallPool opens a pool of at most maxConns connections on the test
// database, closed when the test ends: for a test that takes every
// connection of a pool.
func SmallPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	pool, err := openPoolOf(URL(tb), maxConns)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func openPool(url string) (*pgxpool.Pool, error) { return openPoolOf(url, 30) }

func openPoolOf(url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", EnvURL, err)
	}
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// Name returns a fresh identifier starting with prefix.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s_%s", prefix, hex.EncodeToString(b))
}

// Conversation returns a conversation id no other test uses.
func Conversation(tb testing.TB) string {
	return Name("conv")
}

func migrate(pool *pgxpool.Pool, schema string) error {
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = m.Up(ctx)
	return err
}

// dropSchema drops schema, on a connection of its own when pool cannot
// serve it (a test closed its pool before its cleanups ran).
func dropSchema(pool *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drop := `DROP SCHEMA IF EXISTS ` + pgx.Identifier{schema}.Sanitize() + ` CASCADE`
	if _, err := pool.Exec(ctx, drop); err == nil {
		return
	}
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close(ctx) }()
	_, _ = conn.Exec(ctx, drop)
}
