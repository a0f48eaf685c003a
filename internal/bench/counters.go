package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/cputime"
)

// What a subject cost the database is counted three ways: statements by a
// pgx tracer on the harness's pool (and on the DBOS subprocess's); commits
// by reading the WAL written meanwhile with pg_walinspect (the commit
// records: each one a WAL flush, an fsync, with synchronous_commit on);
// transaction ids and WAL bytes from the server's counters.

// walinspectSchema is where the harness creates pg_walinspect when the
// database does not have it yet; it drops it again at the end of the run.
const walinspectSchema = "arbor_bench_walinspect"

// walinspectUsers counts the runs of this process (Run and Soak, which the
// tests start side by side) using the pg_walinspect that setupWalinspect
// created: the last one to end drops it.
var walinspectUsers struct {
	sync.Mutex
	n int
}

// setupWalinspect finds pg_walinspect, or creates it in a schema of its
// own. It returns the extension's schema ("" when it cannot be had: then
// commits are not counted) and a function that drops what it created once
// no other run of this process uses it. Two harness processes sharing one
// database may still drop it under each other; the other's commits then
// show as not counted, never as a wrong number.
func setupWalinspect(ctx context.Context, pool *pgxpool.Pool) (string, func()) {
	walinspectUsers.Lock()
	defer walinspectUsers.Unlock()
	var schema string
	err := pool.QueryRow(ctx, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
		WHERE e.extname = 'pg_walinspect'`).Scan(&schema)
	ours := err == nil && walinspectUsers.n > 0 && schema == walinspectSchema
	if err == nil && !ours {
		return schema, func() {} // the database's own: left as it is
	}
	q := pgx.Identifier{walinspectSchema}.Sanitize()
	if !ours {
		if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q+`; CREATE EXTENSION pg_walinspect WITH SCHEMA `+q); err != nil {
			_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+q)
			return "", func() {}
		}
	}
	walinspectUsers.n++
	return walinspectSchema, func() {
		walinspectUsers.Lock()
		defer walinspectUsers.Unlock()
		if walinspectUsers.n--; walinspectUsers.n > 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP EXTENSION IF EXISTS pg_walinspect; DROP SCHEMA IF EXISTS `+q+` CASCADE`)
	}
}

// serverCounters are read from PostgreSQL before and after a window.
type serverCounters struct {
	// nextXID is the next transaction id to be assigned: the difference
	// is the number of transactions and subtransactions that wrote (a
	// read-only statement, such as this one, assigns none).
	nextXID int64
	// walBytes is the WAL insert position as a number; lsn is the same as
	// text (the insert position before a window, the flush position after
	// it: every commit of the window has been flushed by then).
	walBytes int64
	lsn      string
}

func readServerCounters(ctx context.Context, pool *pgxpool.Pool, end bool) (serverCounters, error) {
	pos := "pg_current_wal_insert_lsn()"
	if end {
		pos = "pg_current_wal_flush_lsn()"
	}
	var c serverCounters
	err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
		pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, `+pos+`::text`).Scan(&c.nextXID, &c.walBytes, &c.lsn)
	if err != nil {
		return c, fmt.Errorf("read server counters: %w", err)
	}
	return c, nil
}

// commitsBetween counts the commit records in the WAL between two
// positions; -1 when pg_walinspect is not available or cannot read them
// (the WAL was recycled meanwhile).
func (e *Env) commitsBetween(ctx context.Context, from, to string) int64 {
	if e.walinspect == "" {
		return -1
	}
	var n int64
	err := e.Pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0)::bigint FROM `+
		pgx.Identifier{e.walinspect, "pg_get_wal_stats"}.Sanitize()+`($1::pg_lsn, $2::pg_lsn, true)
		WHERE "resource_manager/record_type" = 'Transaction/COMMIT'`, from, to).Scan(&n)
	if err != nil {
		e.Logger.WarnContext(ctx, "bench: could not count commits", "error", err)
		return -1
	}
	return n
}

// Window counts what the database did between its start and its end. The
// harness counts each run as a whole; a RunFunc whose timed part is only a
// piece of its run (scenario c builds a tree, then times the abort alone)
// opens a window of its own around that piece.
type Window struct {
	env        *Env
	before     serverCounters
	stmts0     int64
	clientCPU0 time.Duration
	serverCPU0 time.Duration
	serverOK   bool
	started    time.Time
	// stmts is pg_stat_statements at the start (Options.ByStatement).
	stmts stmtSample
}

// StartWindow starts the clock and the counters.
func (e *Env) StartWindow(ctx context.Context) (*Window, error) {
	before, err := readServerCounters(ctx, e.Pool, false)
	if err != nil {
		return nil, err
	}
	w := &Window{env: e, before: before, stmts0: e.counter.statements.Load(), clientCPU0: cputime.Client()}
	if e.byStatement {
		w.stmts = e.readStatements(ctx)
	}
	w.serverCPU0, w.serverOK = cputime.Server(e.postmaster)
	w.started = time.Now()
	return w, nil
}

// End stops the clock and the counters and returns them as a Measurement
// (Tasks and Phases are the caller's to fill).
func (w *Window) End(ctx context.Context) (Measurement, error) {
	elapsed := time.Since(w.started)
	stmts := w.env.counter.statements.Load() - w.stmts0
	cpu := cputime.Client() - w.clientCPU0
	srv, ok := cputime.Server(w.env.postmaster)
	srv -= w.serverCPU0
	if !ok || !w.serverOK {
		srv = -1
	}
	after, err := readServerCounters(ctx, w.env.Pool, true)
	if err != nil {
		return Measurement{}, err
	}
	m := Measurement{
		Elapsed:    elapsed,
		Statements: stmts,
		Commits:    w.env.commitsBetween(ctx, w.before.lsn, after.lsn),
		XIDs:       after.nextXID - w.before.nextXID,
		WALBytes:   after.walBytes - w.before.walBytes,
		ClientCPU:  cpu,
		ServerCPU:  srv,
		counted:    true,
	}
	if w.env.walByRelation {
		m.WAL = w.env.walBetween(ctx, w.before.lsn, after.lsn)
	}
	if w.env.byStatement && w.stmts != nil {
		if a := w.env.readStatements(ctx); a != nil {
			m.ByStatement = statementsBetween(w.stmts, a)
		}
	}
	return m, nil
}

// walBetween reads the WAL between two positions and sums it by the
// relation each record's first block names (looked up by its file node
// while the run's schema still exists) and the record's type; nil when
// pg_walinspect is not available or cannot read them.
func (e *Env) walBetween(ctx context.Context, from, to string) []WALShare {
	if e.walinspect == "" {
		return nil
	}
	rows, err := e.Pool.Query(ctx, `WITH r AS (
			SELECT w.resource_manager, w.record_type, w.record_length, w.fpi_length,
			       (regexp_match(w.block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid AS node
			FROM `+pgx.Identifier{e.walinspect, "pg_get_wal_records_info"}.Sanitize()+`($1::pg_lsn, $2::pg_lsn) w)
		SELECT coalesce(c.relname, '(' || r.resource_manager || ')'), r.record_type, sum(r.record_length)::bigint, count(*), sum(r.fpi_length)::bigint
		FROM r LEFT JOIN pg_class c ON c.relfilenode = r.node
		GROUP BY 1, 2 ORDER BY 3 DESC`, from, to)
	if err != nil {
		e.Logger.WarnContext(ctx, "bench: could not read the WAL by relation", "error", err)
		return nil
	}
	shares, err := pgx.CollectRows(rows, pgx.RowToStructByPos[WALShare])
	if err != nil {
		e.Logger.WarnContext(ctx, "bench: could not read the WAL by relation", "error", err)
		return nil
	}
	return shares
}

// counter is a pgx tracer that counts the statements sent through the
// harness's pool: each query is a round trip, and so is each batch and
// each COPY. (A statement pgx prepares on first use costs one more round
// trip, once per connection; that is not counted.)
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
