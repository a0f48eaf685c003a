package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Run runs the scenarios o selects and returns their results. It prints each
// scenario's table to o.Out as soon as the scenario ends. A subject that
// fails is reported in its table cell and in the report, and the run goes
// on; Run returns an error only when nothing could be measured at all (no
// database, bad options).
func Run(ctx context.Context, opts Options) (*Report, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	started := time.Now()

	ctr := &counter{}
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: parse database URL: %w", err)
	}
	cfg.MaxConns = int32(o.Conns)
	cfg.ConnConfig.Tracer = ctr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer pool.Close()

	machine, err := readMachine(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep := &Report{
		Machine:   machine,
		StartedAt: started.UTC(),
		Options: ReportOptions{Conns: o.Conns, ClaimBatch: o.ClaimBatch, Quick: o.Quick,
			Reps: o.Reps},
	}
	printMachine(o.Out, rep)

	env := &Env{Pool: pool, URL: o.DatabaseURL, Conns: o.Conns, ClaimBatch: o.ClaimBatch,
		Logger: o.Logger, counter: ctr}
	var dbosWhy string
	if o.wants("b") {
		env.DBOS, dbosWhy = prepareDBOS(ctx, o.DBOSDir, o.Logger)
		if env.DBOS != nil {
			defer env.DBOS.Close()
		}
	}

	for _, s := range Scenarios() {
		if !o.wants(s.Key) {
			continue
		}
		res := ScenarioResult{Key: s.Key, Title: s.Title, About: s.About, Goal: s.Goal, Pending: s.Pending}
		if s.Pending == "" {
			sizes, err := o.sizesFor(s)
			if err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			for _, size := range sizes {
				res.Sizes = append(res.Sizes, runSize(ctx, o, env, s, size, dbosWhy))
			}
		}
		rep.Scenarios = append(rep.Scenarios, res)
		printScenario(o.Out, s, res)
	}
	rep.Elapsed = time.Since(started)
	rep.PeakRSSBytes = peakRSS()
	if env.DBOS != nil {
		rep.DBOSPeakRSSBytes = env.DBOS.peakRSS
	}
	printFooter(o.Out, rep)
	return rep, nil
}

func (o *Options) wants(key string) bool {
	return len(o.Only) == 0 || slices.Contains(o.Only, key)
}

// runSize measures every subject of s at one size, in the scenario's order,
// and computes the ratios against the first (arbor).
func runSize(ctx context.Context, o *Options, env *Env, s Scenario, size Size, dbosWhy string) SizeResult {
	out := SizeResult{Size: size}
	for _, sub := range s.Subjects {
		r := SubjectResult{Key: sub.Key, Label: sub.Label, Unavailable: sub.Unavailable}
		if sub.Key == "dbos" && env.DBOS == nil && r.Unavailable == "" {
			r.Unavailable = dbosWhy
		}
		if r.Unavailable == "" && sub.Run != nil {
			var best *Measurement
			for rep := 0; rep < o.Reps; rep++ {
				o.Logger.InfoContext(ctx, "bench: running", slog.String("scenario", s.Key),
					slog.String("subject", sub.Key), slog.String("size", size.Spec), slog.Int("rep", rep+1))
				m, err := runOnce(ctx, o, env, sub.Run, size)
				if err != nil {
					r.Error = err.Error()
					o.Logger.ErrorContext(ctx, "bench: run failed", slog.String("scenario", s.Key),
						slog.String("subject", sub.Key), slog.String("size", size.Spec), slog.String("error", err.Error()))
					best = nil
					break
				}
				if best == nil || m.Elapsed < best.Elapsed {
					best = &m
				}
			}
			if best != nil {
				r.fill(s.Metric, best)
			}
		}
		out.Subjects = append(out.Subjects, r)
	}
	if len(out.Subjects) > 0 && out.Subjects[0].TasksPerSec > 0 {
		for i := 1; i < len(out.Subjects); i++ {
			if b := out.Subjects[i].TasksPerSec; b > 0 {
				out.Subjects[i].ArborRatio = out.Subjects[0].TasksPerSec / b
			}
		}
	}
	return out
}

// runOnce runs fn in a fresh schema, counting what it cost the database.
func runOnce(ctx context.Context, o *Options, env *Env, fn RunFunc, size Size) (Measurement, error) {
	schema, drop, err := newSchema(ctx, env.Pool)
	if err != nil {
		return Measurement{}, err
	}
	defer drop()
	runEnv := *env
	runEnv.Schema = schema
	ctx, cancel := context.WithTimeout(ctx, o.RunTimeout)
	defer cancel()

	before, err := readServerCounters(ctx, env.Pool)
	if err != nil {
		return Measurement{}, err
	}
	stmts0 := env.counter.statements.Load()
	m, err := fn(ctx, &runEnv, size)
	stmts1 := env.counter.statements.Load()
	if err != nil {
		return Measurement{}, err
	}
	after, err := readServerCounters(ctx, env.Pool)
	if err != nil {
		return Measurement{}, err
	}
	if m.Statements == 0 {
		m.Statements = stmts1 - stmts0
	}
	if m.WriteTxs == 0 {
		m.WriteTxs = after.nextXID - before.nextXID
	}
	if m.WALBytes == 0 {
		m.WALBytes = after.walBytes - before.walBytes
	}
	if m.Tasks == 0 {
		m.Tasks = size.Tasks
	}
	return m, nil
}

// Window counts what the database did between its start and its end,
// for a RunFunc whose timed part is only a piece of its run (scenario c
// builds a tree, then times the abort alone).
type Window struct {
	env     *Env
	before  serverCounters
	stmts0  int64
	started time.Time
}

// StartWindow starts counting.
func (e *Env) StartWindow(ctx context.Context) (*Window, error) {
	before, err := readServerCounters(ctx, e.Pool)
	if err != nil {
		return nil, err
	}
	return &Window{env: e, before: before, stmts0: e.counter.statements.Load(), started: time.Now()}, nil
}

// End stops the clock and the counters and returns them as a Measurement
// (Tasks and Phases left for the caller).
func (w *Window) End(ctx context.Context) (Measurement, error) {
	elapsed := time.Since(w.started)
	stmts := w.env.counter.statements.Load() - w.stmts0
	after, err := readServerCounters(ctx, w.env.Pool)
	if err != nil {
		return Measurement{}, err
	}
	return Measurement{Elapsed: elapsed, Statements: stmts, WriteTxs: after.nextXID - w.before.nextXID,
		WALBytes: after.walBytes - w.before.walBytes}, nil
}

// serverCounters are read from PostgreSQL before and after a run.
type serverCounters struct {
	// nextXID is the next transaction id to be assigned: the difference is
	// the number of transactions that wrote (plus the one read-only
	// statement of ours, which assigns none).
	nextXID  int64
	walBytes int64
}

func readServerCounters(ctx context.Context, pool *pgxpool.Pool) (serverCounters, error) {
	var c serverCounters
	err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
		pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&c.nextXID, &c.walBytes)
	if err != nil {
		return c, fmt.Errorf("read server counters: %w", err)
	}
	return c, nil
}

// counter is a pgx tracer that counts the statements sent through the
// harness's pool: each query is a round trip, and so is each batch and
// each COPY.
type counter struct {
	statements atomic.Int64
}

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

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// errUnfinished is returned by a run whose work did not all finish in time.
var errUnfinished = errors.New("the work did not finish")
