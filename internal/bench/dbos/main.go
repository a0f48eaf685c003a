// Command dbos-bench is the DBOS Transact Go side of arbor's fan-out/fan-in
// benchmark (issue 6, scenario b). It lives in a Go module of its own so
// that arbor never depends on DBOS; arbor's bench harness
// (internal/bench) builds it and runs it as a subprocess. It requires
// arbor's module (a replace of this checkout) for one package only,
// internal/cputime, so that it measures CPU time with the harness's own
// code; that puts it on arbor's versions of pgx and its dependencies.
//
// It launches DBOS on the given database and schema with a pool of -conns
// connections, then runs -parents parent workflows, each starting
// -children child workflows and waiting for their results, and prints one
// JSON object on stdout: the workload's elapsed time (DBOS's launch and
// migrations excluded), what it cost the database, and the number of
// workflows that ended in SUCCESS.
//
//	go run . -url "$ARBOR_DATABASE_URL" -schema dbos_bench_x -parents 10 -children 100
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/cputime"
)

// result is what the harness reads; its field names match the harness's
// Measurement JSON where they mean the same.
type result struct {
	ElapsedNS  int64 `json:"elapsed_ns"`
	Tasks      int   `json:"tasks"`
	Statements int64 `json:"statements"`
	XIDs       int64 `json:"xids"`
	WALBytes   int64 `json:"wal_bytes"`
	// WALStartLSN and WALEndLSN bound the workload's WAL (insert position
	// before, flush position after), for the harness to count its commits.
	WALStartLSN string `json:"wal_start_lsn"`
	WALEndLSN   string `json:"wal_end_lsn"`
	// ClientCPUNS is this process's CPU time during the workload;
	// ServerCPUNS the PostgreSQL server's, -1 when it cannot be read.
	ClientCPUNS int64  `json:"client_cpu_ns"`
	ServerCPUNS int64  `json:"server_cpu_ns"`
	DBOSVersion string `json:"dbos_version"`
	// PeakRSSBytes is this process's peak resident memory (VmHWM).
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

func main() {
	var (
		url      = flag.String("url", os.Getenv("ARBOR_DATABASE_URL"), "PostgreSQL URL (default $ARBOR_DATABASE_URL)")
		schema   = flag.String("schema", "dbos_bench", "schema for DBOS's system tables (created by DBOS)")
		parents  = flag.Int("parents", 10, "parent workflows")
		children = flag.Int("children", 100, "child workflows per parent")
		conns    = flag.Int("conns", 8, "connections in DBOS's pool")
		timeout  = flag.Duration("timeout", 5*time.Minute, "give up after this long")
	)
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, *url, *schema, *parents, *children, *conns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbos-bench:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "dbos-bench:", err)
		os.Exit(1)
	}
}

// parentWorkflow starts n child workflows and waits for each one's result.
func parentWorkflow(ctx dbos.Context, n int) (int, error) {
	handles := make([]dbos.WorkflowHandle[int], n)
	for i := range handles {
		h, err := dbos.RunWorkflow(ctx, childWorkflow, i)
		if err != nil {
			return 0, err
		}
		handles[i] = h
	}
	sum := 0
	for _, h := range handles {
		r, err := h.GetResult()
		if err != nil {
			return 0, err
		}
		sum += r
	}
	return sum, nil
}

// childWorkflow is the no-op child.
func childWorkflow(_ dbos.Context, i int) (int, error) { return i, nil }

func run(ctx context.Context, url, schema string, parents, children, conns int) (*result, error) {
	if url == "" {
		return nil, errors.New("no database URL: pass -url or set ARBOR_DATABASE_URL")
	}
	ctr := &counter{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.Tracer = ctr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:        "arbor-bench",
		SystemDBPool:   pool,
		DatabaseSchema: schema,
		Logger:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("dbos: new context: %w", err)
	}
	dbos.RegisterWorkflow(dctx, parentWorkflow)
	dbos.RegisterWorkflow(dctx, childWorkflow)
	if err := dbos.Launch(dctx); err != nil {
		return nil, fmt.Errorf("dbos: launch: %w", err)
	}
	defer dbos.Shutdown(dctx, 10*time.Second)

	before, err := serverCounters(ctx, pool)
	if err != nil {
		return nil, err
	}
	stmts0 := ctr.statements.Load()
	postmaster := cputime.FindPostmaster(ctx, pool)
	cpu0 := cputime.Client()
	srv0, srvOK0 := cputime.Server(postmaster)
	start := time.Now()
	handles := make([]dbos.WorkflowHandle[int], parents)
	for i := range handles {
		if handles[i], err = dbos.RunWorkflow(dctx, parentWorkflow, children); err != nil {
			return nil, fmt.Errorf("start parent %d: %w", i, err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, parents)
	for i, h := range handles {
		wg.Go(func() {
			sum, err := h.GetResult()
			if err == nil && sum != children*(children-1)/2 {
				err = fmt.Errorf("sum of children's results %d, want %d", sum, children*(children-1)/2)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stmts := ctr.statements.Load() - stmts0
	cpu := cputime.Client() - cpu0
	srv, srvOK := cputime.Server(postmaster)
	srv -= srv0
	if !srvOK || !srvOK0 {
		srv = -1
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	after, err := serverCounters(ctx, pool)
	if err != nil {
		return nil, err
	}

	var succeeded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "workflow_status"}.Sanitize()+
		` WHERE status = 'SUCCESS'`).Scan(&succeeded); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if want := parents * (children + 1); succeeded != want {
		return nil, fmt.Errorf("verify: %d workflows succeeded, want %d", succeeded, want)
	}
	return &result{
		ElapsedNS:    elapsed.Nanoseconds(),
		Tasks:        succeeded,
		Statements:   stmts,
		XIDs:         after.nextXID - before.nextXID,
		WALBytes:     after.walBytes - before.walBytes,
		WALStartLSN:  before.insertLSN,
		WALEndLSN:    after.flushLSN,
		DBOSVersion:  dbosVersion(),
		PeakRSSBytes: peakRSS(),
		ClientCPUNS:  cpu.Nanoseconds(),
		ServerCPUNS:  srv.Nanoseconds(),
	}, nil
}

type counters struct {
	nextXID, walBytes   int64
	insertLSN, flushLSN string
}

// serverCounters reads the next transaction id and the WAL positions, as
// the harness does.
func serverCounters(ctx context.Context, pool *pgxpool.Pool) (counters, error) {
	var c counters
	err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
		pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
		pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text`).Scan(&c.nextXID, &c.walBytes, &c.insertLSN, &c.flushLSN)
	return c, err
}

// peakRSS returns VmHWM from /proc/self/status in bytes, 0 if unknown. (Not
// getrusage: Linux carries the parent's high-water mark across exec.)
func peakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func dbosVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/dbos-inc/dbos-transact-golang" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// counter counts the statements sent through DBOS's pool, as the harness
// counts its own: a query, a batch or a COPY is one round trip.
type counter struct{ statements atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *counter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *counter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
