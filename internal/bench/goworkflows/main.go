// Command goworkflows-bench is the go-workflows side of arbor's agent-turns
// benchmark (issue 42, scenario h). It lives in a Go module of its own so
// that arbor never depends on go-workflows; arbor's bench harness
// (internal/bench) builds it and runs it as a subprocess, as it does the
// DBOS module beside it. It requires arbor's module (a replace of this
// checkout) for one package only, internal/cputime, so that it measures CPU
// time with the harness's own code.
//
// It creates the given schema, applies go-workflows' Postgres migrations in
// it (through a database/sql pool of -conns connections whose search_path
// is that schema), and wraps the Postgres backend in go-workflows'
// monoprocess backend, as go-workflows' own benchmark (its bench command)
// does: the worker is woken in process when a task is ready, instead of
// polling. Then it runs -parents turn workflows, each making -children tool
// calls at once and waiting for all of them: as activities (-tools
// activities) or as sub-workflows (-tools subworkflows). It prints one JSON
// object on stdout: the workload's elapsed time (from the first turn created
// to the last turn's completion committed; the migrations excluded), what it
// cost the database, and the number of tasks done. The harness drops the
// schema afterwards.
//
//	go run . -url "$ARBOR_DATABASE_URL" -schema gowf_bench_x -parents 10 -children 5
package main

import (
	"context"
	"database/sql"
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

	"github.com/cschleiden/go-workflows/backend"
	"github.com/cschleiden/go-workflows/backend/history"
	"github.com/cschleiden/go-workflows/backend/monoprocess"
	"github.com/cschleiden/go-workflows/backend/postgres"
	"github.com/cschleiden/go-workflows/client"
	"github.com/cschleiden/go-workflows/core"
	"github.com/cschleiden/go-workflows/worker"
	"github.com/cschleiden/go-workflows/workflow"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/arborhq/arbor/internal/cputime"
)

// result is what the harness reads; its field names match the DBOS
// subprocess's where they mean the same.
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
	ClientCPUNS int64 `json:"client_cpu_ns"`
	ServerCPUNS int64 `json:"server_cpu_ns"`
	// Version is go-workflows' module version, as built.
	Version string `json:"version"`
	// PeakRSSBytes is this process's peak resident memory (VmHWM).
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

func main() {
	var (
		url      = flag.String("url", os.Getenv("ARBOR_DATABASE_URL"), "PostgreSQL URL (default $ARBOR_DATABASE_URL)")
		schema   = flag.String("schema", "gowf_bench", "schema for go-workflows' tables (created here; the caller drops it)")
		parents  = flag.Int("parents", 10, "turn workflows")
		children = flag.Int("children", 5, "tool calls per turn")
		tools    = flag.String("tools", "activities", "how a turn makes its tool calls: activities or subworkflows")
		conns    = flag.Int("conns", 8, "connections in go-workflows' database/sql pool")
		timeout  = flag.Duration("timeout", 5*time.Minute, "give up after this long")
	)
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, *url, *schema, *tools, *parents, *children, *conns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goworkflows-bench:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "goworkflows-bench:", err)
		os.Exit(1)
	}
}

// TurnActivities makes n tool calls as activities at once and returns the
// sum of their results.
func TurnActivities(ctx workflow.Context, n int) (int, error) {
	fs := make([]workflow.Future[int], n)
	for i := range fs {
		fs[i] = workflow.ExecuteActivity[int](ctx, workflow.DefaultActivityOptions, Tool, i)
	}
	return sum(ctx, fs)
}

// TurnSubWorkflows makes n tool calls as sub-workflows at once and returns
// the sum of their results.
func TurnSubWorkflows(ctx workflow.Context, n int) (int, error) {
	fs := make([]workflow.Future[int], n)
	for i := range fs {
		fs[i] = workflow.CreateSubWorkflowInstance[int](ctx, workflow.DefaultSubWorkflowOptions, ToolWorkflow, i)
	}
	return sum(ctx, fs)
}

func sum(ctx workflow.Context, fs []workflow.Future[int]) (int, error) {
	total := 0
	for _, f := range fs {
		r, err := f.Get(ctx)
		if err != nil {
			return 0, err
		}
		total += r
	}
	return total, nil
}

// Tool is the no-op tool call as an activity.
func Tool(_ context.Context, i int) (int, error) { return i, nil }

// ToolWorkflow is the no-op tool call as a sub-workflow.
func ToolWorkflow(_ workflow.Context, i int) (int, error) { return i, nil }

func run(ctx context.Context, url, schema, tools string, parents, children, conns int) (res *result, err error) {
	if url == "" {
		return nil, errors.New("no database URL: pass -url or set ARBOR_DATABASE_URL")
	}
	var turn workflow.Workflow
	tasks := parents * (children + 1)
	switch tools {
	case "activities":
		turn = TurnActivities
	case "subworkflows":
		turn = TurnSubWorkflows
	default:
		return nil, fmt.Errorf("-tools %q: want activities or subworkflows", tools)
	}

	// The harness's counters (statements aside) are read on a pool of its
	// own, outside the window's statement count.
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}

	ctr := &counter{}
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cc.RuntimeParams["search_path"] = schema
	cc.Tracer = ctr
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	// go-workflows' benchmark sets only the open connections; the idle ones
	// are kept too, so that its pool holds its connections as pgxpool does
	// for every other subject, instead of database/sql's two.
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)

	pb, err := newPostgresBackend(db)
	if err != nil {
		return nil, err
	}
	finished := &finishWatch{Backend: monoprocess.NewMonoprocessBackend(pb), want: parents, done: make(chan struct{})}
	finished.roots.m = map[string]bool{}

	opts := worker.DefaultOptions
	w := worker.New(finished, &opts)
	if err := w.RegisterWorkflow(turn); err != nil {
		return nil, err
	}
	if err := w.RegisterWorkflow(ToolWorkflow); err != nil {
		return nil, err
	}
	if err := w.RegisterActivity(Tool); err != nil {
		return nil, err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	if err := w.Start(wctx); err != nil {
		stopWorker()
		return nil, fmt.Errorf("start worker: %w", err)
	}
	defer func() {
		stopWorker()
		_ = w.WaitForCompletion()
	}()
	c := client.New(finished)

	before, err := serverCounters(ctx, pool)
	if err != nil {
		return nil, err
	}
	stmts0 := ctr.statements.Load()
	postmaster := cputime.FindPostmaster(ctx, pool)
	cpu0 := cputime.Client()
	srv0, srvOK0 := cputime.Server(postmaster)
	start := time.Now()
	instances := make([]*workflow.Instance, parents)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for g := range conns {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= parents {
					return
				}
				inst, err := c.CreateWorkflowInstance(ctx, client.WorkflowInstanceOptions{InstanceID: fmt.Sprintf("turn-%d", i)}, turn, children)
				if err != nil {
					errs[g] = fmt.Errorf("create turn %d: %w", i, err)
					return
				}
				instances[i] = inst
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	select {
	case <-finished.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%d of %d turns finished: %w", finished.count(), parents, ctx.Err())
	}
	elapsed := time.Since(start)
	stmts := ctr.statements.Load() - stmts0
	cpu := cputime.Client() - cpu0
	srv, srvOK := cputime.Server(postmaster)
	srv -= srv0
	if !srvOK || !srvOK0 {
		srv = -1
	}
	after, err := serverCounters(ctx, pool)
	if err != nil {
		return nil, err
	}

	// Verify, outside the window: every turn's result is the sum of its
	// tool calls' results, and every workflow instance finished.
	want := children * (children - 1) / 2
	for _, inst := range instances {
		got, err := client.GetWorkflowResult[int](ctx, c, inst, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", inst.InstanceID, err)
		}
		if got != want {
			return nil, fmt.Errorf("verify %s: sum of tool results %d, want %d", inst.InstanceID, got, want)
		}
	}
	wantInstances := parents
	if tools == "subworkflows" {
		wantInstances = tasks
	}
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "instances"}.Sanitize()+
		` WHERE state = $1 AND completed_at IS NOT NULL`, int(core.WorkflowInstanceStateFinished)).Scan(&done); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if done != wantInstances {
		return nil, fmt.Errorf("verify: %d workflow instances finished, want %d", done, wantInstances)
	}
	return &result{
		ElapsedNS:    elapsed.Nanoseconds(),
		Tasks:        tasks,
		Statements:   stmts,
		XIDs:         after.nextXID - before.nextXID,
		WALBytes:     after.walBytes - before.walBytes,
		WALStartLSN:  before.insertLSN,
		WALEndLSN:    after.flushLSN,
		Version:      moduleVersion(),
		PeakRSSBytes: peakRSS(),
		ClientCPUNS:  cpu.Nanoseconds(),
		ServerCPUNS:  srv.Nanoseconds(),
	}, nil
}

// newPostgresBackend makes go-workflows' Postgres backend on db and applies
// its migrations (in db's search_path schema); the constructor panics when
// they fail, which is returned here as an error.
func newPostgresBackend(db *sql.DB) (b backend.Backend, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("go-workflows postgres backend: %v", p)
		}
	}()
	return postgres.NewPostgresBackendWithDB(db,
		postgres.WithApplyMigrations(true),
		postgres.WithBackendOptions(backend.WithLogger(slog.New(slog.DiscardHandler))),
	), nil
}

// finishWatch passes everything to the backend it wraps, and notes each
// root workflow (a turn) whose finishing task was committed: the end of
// the clock, seen in process as the harness sees arbor's last parent
// complete, rather than through the client's polling wait (a backoff of up
// to a second).
type finishWatch struct {
	backend.Backend
	want int
	done chan struct{}

	roots struct {
		sync.Mutex
		m map[string]bool
	}
}

func (f *finishWatch) CompleteWorkflowTask(ctx context.Context, task *backend.WorkflowTask, state core.WorkflowInstanceState,
	executed, activityEvents, timerEvents []*history.Event, workflowEvents []*history.WorkflowEvent) error {
	if err := f.Backend.CompleteWorkflowTask(ctx, task, state, executed, activityEvents, timerEvents, workflowEvents); err != nil {
		return err
	}
	if state == core.WorkflowInstanceStateFinished && task.WorkflowInstance.Parent == nil {
		f.roots.Lock()
		defer f.roots.Unlock()
		if !f.roots.m[task.WorkflowInstance.InstanceID] {
			f.roots.m[task.WorkflowInstance.InstanceID] = true
			if len(f.roots.m) == f.want {
				close(f.done)
			}
		}
	}
	return nil
}

func (f *finishWatch) count() int {
	f.roots.Lock()
	defer f.roots.Unlock()
	return len(f.roots.m)
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

func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/cschleiden/go-workflows" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// counter counts the statements sent through go-workflows' pool, as the
// harness counts its own: a query, a batch or a COPY is one round trip (a
// transaction's BEGIN and COMMIT each one, as pgx sends them).
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
