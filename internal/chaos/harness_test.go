package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Bounds for a broken test, not expectations: every wait is on a
// condition.
const (
	settleWithin = 4 * time.Minute
	waitWithin   = 2 * time.Minute
	queryWithin  = 2 * time.Minute // a query of the test's, retried through a restart
)

// envKeepLogs names a folder to keep the runner processes' logs in, with
// the run log, the audit and the tasks as CSV (one folder per test); by
// default the logs go to the test's temporary folder, and the tables with
// its schema.
const envKeepLogs = "ARBOR_CHAOS_LOGS"

// envSeed sets the seed of the moments of the faults (a number of handler
// calls after the last one), to run a scenario again as it was logged.
const envSeed = "ARBOR_CHAOS_SEED"

// scenario is what a test needs: its own schema (with the run log, the
// side effects, the faults and the audit trigger), the test's engine and
// pool, the turns it created, and the runner processes it started.
type scenario struct {
	t        *testing.T
	ctx      context.Context
	pool     *pgxpool.Pool
	schema   string
	engine   *tasks.Engine
	logDir   string
	rng      *rand.Rand
	began    time.Time
	convs    []string
	turns    []int64
	fans     []int // the leaves each turn spawns (0: none)
	children []*child

	// onceLeaves makes the leaves of the turns addTurns creates from then
	// on abandon_on_restart (see the workload).
	onceLeaves bool
}

// setup gives a test a migrated schema of its own with the run log, the
// side effects, the faults and the audit trigger, and creates
// conversations turns of the tree workload, one turn each. The tests do not
// run in parallel (no t.Parallel): one of them restarts the database
// server, which would hit every other test sharing it, and on a two-core
// machine parallel runner processes would starve each other into lease
// losses that belong to no scenario.
//
// Every task is created with the engine's default restart limit
// (tasks.RestartLimitDefault): the proof accepts a task failed by it only
// when kills and freezes really cut its runs more often (see verify).
func setup(t *testing.T, conversations int) *scenario {
	requireChaos(t)
	pool, schema := testdb.Fresh(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSeed); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, envSeed)
	}
	t.Logf("seed %d (%s=%d makes the faults come at the same counts of handler calls)", seed, envSeed, seed)
	s := &scenario{t: t, ctx: context.Background(), pool: pool, schema: schema, logDir: t.TempDir(),
		rng: rand.New(rand.NewPCG(seed, seed>>1)), began: time.Now()}
	if dir := os.Getenv(envKeepLogs); dir != "" {
		s.logDir = filepath.Join(dir, t.Name())
		require.NoError(t, os.MkdirAll(s.logDir, 0o755))
		t.Logf("runner logs in %s", s.logDir)
	}
	s.requireOneClock()
	for _, ddl := range []string{runLogDDL, sideEffectsDDL, faultsDDL, auditDDL, leasesViewDDL} {
		s.exec(ddl)
	}
	engine, err := tasks.New(s.ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	require.Equal(t, tasks.RestartLimitDefault, engine.Config().RestartLimit, "the workload runs at the engine's default restart limit")
	s.engine = engine
	s.addTurns(conversations, nil)
	return s
}

// addTurns creates n more conversations of one turn each; fan, when not
// nil, gives the number of leaves the i-th of them spawns beside its tree
// (see the workload).
func (s *scenario) addTurns(n int, fan func(i int) int) {
	s.t.Helper()
	for range n {
		i := len(s.convs)
		k := 0
		if fan != nil {
			k = fan(i)
		}
		conv := fmt.Sprintf("chaos-%04d", i)
		value := map[string]any{"name": "turn", "fan": k}
		if s.onceLeaves {
			value["once_leaves"] = true
		}
		in, _ := json.Marshal(map[string]any{"value": value})
		var turn arbortype.Task
		s.retry("create "+conv, func(ctx context.Context) error {
			var err error
			turn, _, err = s.engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: turnKind, Input: in,
				IdempotencyKey: "turn"})
			return err
		})
		s.convs = append(s.convs, conv)
		s.turns = append(s.turns, turn.ID)
		s.fans = append(s.fans, k)
	}
}

// requireOneClock checks what the proof's timestamps rest on: the test
// process, the runner processes and the database server run on one host
// and read one clock (CLOCK_REALTIME), so a time.Now() of any of them and
// the server's clock_timestamp() are comparable. The handlers stamp their
// entry, their return and their side effects with time.Now() at the moment
// itself, not with the server's clock at the moment the statement that
// records it arrives: under a blackholed route, a frozen process or a
// restarting server that statement comes late, and a late stamp would move
// a return after a later call's entry that it preceded. A server on
// another host (ARBOR_DATABASE_URL) would break this, so it is checked: the
// server's clock is read between two readings of ours.
func (s *scenario) requireOneClock() {
	s.t.Helper()
	for range 3 {
		before := time.Now().Truncate(time.Microsecond)
		var server time.Time
		require.NoError(s.t, s.pool.QueryRow(s.ctx, `SELECT clock_timestamp()`).Scan(&server))
		after := time.Now().Add(time.Microsecond)
		require.False(s.t, server.Before(before) || server.After(after),
			"the database server's clock (%s) is not between two readings of this process's (%s, %s): the chaos proof compares timestamps of both, so they must share one host's clock",
			server, before, after)
	}
}

// The run log: one row per call of a handler, written by the handler's
// wrapper (workload_test.go) on its own pool — which goes to the database
// directly even when arbor's pool of its process is cut off (a blackholed
// route): it stands for the outside world, which sees every call — in
// statements of its own, not in arbor's transactions.
//
// started_at is the call's entry (the wrapper's first act, before anything
// of the call happens) and returned_at its return (the wrapper's last act,
// after everything of the call happened), both read from the clock at that
// moment (see requireOneClock); returned_at is null when the process died
// first (chaos_faults says when). cancelled_at is when the call's context
// was cancelled, if before it returned, and cause is context.Cause then.
// stubborn marks the kind that ignores its context. refused counts the
// writes of the call that arbor refused.
const runLogDDL = `CREATE TABLE {s}.run_log (
	id              bigint PRIMARY KEY,
	task_id         bigint NOT NULL,
	conversation_id text NOT NULL,
	token           bigint NOT NULL,
	node            text NOT NULL,
	kind            text NOT NULL,
	stubborn        boolean NOT NULL,
	attempt         integer NOT NULL,
	started_at      timestamptz NOT NULL,
	returned_at     timestamptz,
	cancelled_at    timestamptz,
	cause           text,
	outcome         text,
	refused         integer NOT NULL DEFAULT 0);
CREATE INDEX ON {s}.run_log (task_id);
CREATE INDEX ON {s}.run_log (token)`

// side_effects: every side effect of a call (a tool's work step, a call
// upstream), recorded before it happens, on the same pool as the run log.
// checked_at is the moment the call decided to do it: for a well-behaved
// call, right after it found its context not cancelled; at is when the
// record reached the database (later than checked_at when the process was
// frozen, or the server restarting, in between).
const sideEffectsDDL = `CREATE TABLE {s}.side_effects (
	id         bigint PRIMARY KEY,
	call_id    bigint NOT NULL,
	task_id    bigint NOT NULL,
	node       text NOT NULL,
	what       text NOT NULL,
	stubborn   boolean NOT NULL,
	checked_at timestamptz NOT NULL,
	at         timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON {s}.side_effects (task_id)`

// chaos_faults: every fault the scenario made, with its window, by the
// test's clock: "kill" (a node's process gone; from_at = to_at, the moment
// the test saw it gone), "freeze" (SIGSTOP to SIGCONT, shorter than the
// lease), "freeze_past_lease" (longer: another node took over meanwhile),
// "cut" (the node's route to the database blackholed, to healed), "lock" (a
// conversation row locked by the test). They are what explains a restart
// (see recoveriesSQL) and what ends a killed call.
const faultsDDL = `CREATE TABLE {s}.chaos_faults (
	id              serial PRIMARY KEY,
	kind            text NOT NULL,
	node            text,
	conversation_id text,
	from_at         timestamptz NOT NULL,
	to_at           timestamptz NOT NULL)`

// fault records a fault and its window.
func (s *scenario) fault(kind, node, conv string, from, to time.Time) {
	s.t.Helper()
	s.exec(`INSERT INTO {s}.chaos_faults (kind, node, conversation_id, from_at, to_at) VALUES ($1, nullif($2, ''), nullif($3, ''), $4, $5)`,
		kind, node, conv, from, to)
}

// The audit: a row for every task row version that matters, written by a
// trigger in the transaction that wrote the version — so it commits, or
// not, with it. For a write that carries a run's stamp ({"by": {token,
// node}} in a result, state or child input; "(token N)" ending an error
// message) it records that token next to the task's token at that moment
// (old_token; for a spawn, the owner's token and status): a write from a
// run whose token was no longer current would show as by_token ≠ old_token.
// For a start (→ running) it records the run's epoch next to the
// conversation's holder and epoch at that moment. For every change of
// status or token it records the transition, with the attempts before and
// after and the error code, so the moment each token died is known, and
// every recovery (attempt + 1, or abandoned_on_restart, or
// restart_limit_exceeded) is seen. app is the writer's application_name:
// which process wrote. Heartbeats (no status, token or document change) are
// left out.
const auditDDL = `CREATE TABLE {s}.chaos_audit (
	id            bigserial PRIMARY KEY,
	task_id       bigint NOT NULL,
	op            text NOT NULL,
	old_status    text,
	new_status    text NOT NULL,
	old_token     bigint,
	new_token     bigint,
	old_attempt   integer,
	new_attempt   integer NOT NULL,
	error_code    text,
	by_token      bigint,
	by_node       text,
	owner_status  text,
	owner_token   bigint,
	new_run_epoch bigint,
	conv_holder   text,
	conv_epoch    bigint,
	app           text NOT NULL,
	at            timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON {s}.chaos_audit (task_id);
CREATE INDEX ON {s}.chaos_audit (new_token);
CREATE FUNCTION {s}.chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	v_doc     jsonb;
	v_by      bigint;
	v_node    text;
	v_otoken  bigint;
	v_ostatus text;
	v_holder  text;
	v_epoch   bigint;
BEGIN
	IF TG_OP = 'INSERT' THEN
		v_doc := NEW.input;
		IF NEW.owner_task_id IS NOT NULL THEN
			SELECT t.token, t.status INTO v_otoken, v_ostatus FROM {s}.tasks t WHERE t.id = NEW.owner_task_id;
		END IF;
	ELSIF NEW.result IS DISTINCT FROM OLD.result THEN
		v_doc := NEW.result;
	ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
		v_doc := NEW.state;
	ELSIF NEW.error IS DISTINCT FROM OLD.error THEN
		v_by := substring(NEW.error->>'message' from '\(token ([0-9]+)\)$')::bigint;
	END IF;
	IF jsonb_typeof(v_doc) = 'object' AND jsonb_typeof(v_doc->'by') = 'object' THEN
		v_by := (v_doc->'by'->>'token')::bigint;
		v_node := v_doc->'by'->>'node';
	END IF;
	IF TG_OP = 'UPDATE' AND v_by IS NULL AND NEW.status = OLD.status AND NEW.token IS NOT DISTINCT FROM OLD.token
		AND NEW.attempt = OLD.attempt THEN
		RETURN NULL;
	END IF;
	IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
		SELECT c.holder, c.epoch INTO v_holder, v_epoch FROM {s}.conversations c WHERE c.id = NEW.conversation_id;
	END IF;
	INSERT INTO {s}.chaos_audit (task_id, op, old_status, new_status, old_token, new_token, old_attempt, new_attempt,
		error_code, by_token, by_node, owner_status, owner_token, new_run_epoch, conv_holder, conv_epoch, app)
	VALUES (NEW.id, lower(TG_OP), CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
		CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token, CASE WHEN TG_OP = 'UPDATE' THEN OLD.attempt END,
		NEW.attempt, NEW.error->>'code', v_by, v_node, v_ostatus, v_otoken,
		NEW.run_epoch, v_holder, v_epoch, current_setting('application_name'));
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON {s}.tasks FOR EACH ROW EXECUTE FUNCTION {s}.chaos_audit()`

// conversation_leases: each conversation with its holder and the holder's
// lease deadline (the holder row's: docs/design.md §3.8).
const leasesViewDDL = `CREATE VIEW {s}.conversation_leases AS
	SELECT c.id, c.holder, c.epoch, h.expires_at AS lease_expires_at
	FROM {s}.conversations c LEFT JOIN {s}.holders h ON h.id = c.holder_id`

// q puts the scenario's schema into a statement.
func (s *scenario) q(sql string) string {
	return strings.ReplaceAll(sql, "{s}", pgx.Identifier{s.schema}.Sanitize())
}

// retry runs fn until it succeeds, again after each error for queryWithin:
// the test's own queries go on through a restart of the server.
func (s *scenario) retry(what string, fn func(ctx context.Context) error) {
	s.t.Helper()
	deadline := time.Now().Add(queryWithin)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil {
			return
		}
		require.True(s.t, time.Now().Before(deadline), "%s: %v", what, err)
		time.Sleep(wait)
	}
}

func (s *scenario) exec(sql string, args ...any) {
	s.t.Helper()
	s.retry(sql, func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, s.q(sql), args...)
		return err
	})
}

// count runs a query that returns one integer.
func (s *scenario) count(sql string, args ...any) int {
	s.t.Helper()
	var n int
	s.retry(sql, func(ctx context.Context) error { return s.pool.QueryRow(ctx, s.q(sql), args...).Scan(&n) })
	return n
}

// waitFor polls cond until it holds; the bound is for a broken test,
// which fails with the live tasks and the runners' sessions.
func (s *scenario) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(waitWithin)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; live tasks:\n%s\nrunner sessions:\n%s%s", what, s.dumpLive(), s.dumpSessions(), s.dumpLogs(15))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dumpLogs is the last n lines of each runner process's log.
func (s *scenario) dumpLogs(n int) string {
	var b strings.Builder
	for _, c := range s.children {
		fmt.Fprintf(&b, "\nrunner %s's log, its last %d lines:\n%s\n", c.node, n, tail(c.log, n))
	}
	return b.String()
}

// dumpSessions describes the runner processes' sessions that are not idle.
func (s *scenario) dumpSessions() string {
	return strings.Join(s.rows(`SELECT pid, application_name AS app, state, (now() - xact_start)::text AS xact_age,
			wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, left(query, 120) AS query
		FROM pg_stat_activity WHERE application_name LIKE '`+appPrefix+`%' AND state <> 'idle' ORDER BY xact_start`), "\n")
}

// runs is how many handler calls the run log has: the workload's progress.
func (s *scenario) runs() int { return s.count(`SELECT count(*) FROM {s}.run_log`) }

func (s *scenario) live() int {
	return s.count(`SELECT count(*) FROM {s}.tasks WHERE status IN ('pending','running','waiting','sleeping','completing')`)
}

// waitProgress waits until n more handler calls were logged than from,
// or the workload is done; it returns the calls logged by then.
func (s *scenario) waitProgress(from, n int) int {
	s.t.Helper()
	var now int
	s.waitFor(fmt.Sprintf("%d more runs", n), func() bool {
		now = s.runs()
		return now >= from+n || s.done()
	})
	return now
}

// done reports whether every turn settled and nothing is live.
func (s *scenario) done() bool { return s.live() == 0 && len(s.turns) > 0 }

// waitSettled waits until every task settled, or fails the test with the
// tasks still live.
func (s *scenario) waitSettled() {
	s.t.Helper()
	deadline := time.Now().Add(settleWithin)
	last, since, told := -1, time.Now(), false
	for !s.done() {
		if time.Now().After(deadline) {
			s.t.Fatalf("lost work: tasks still live %s after the start:\n%s\nrunner sessions:\n%s",
				time.Since(s.began).Round(time.Second), s.dumpLive(), s.dumpSessions())
		}
		// A workload that stops moving is worth a look while it stands
		// still: what is live, and what the runners' sessions wait for.
		if n := s.runs(); n != last {
			last, since, told = n, time.Now(), false
		} else if !told && time.Since(since) > 3*time.Second {
			told = true
			s.t.Logf("no handler call for 3 s with tasks live:\n%s\nrunner sessions:\n%s", s.dumpLive(), s.dumpSessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dumpLive describes the live tasks and their conversations' holders.
func (s *scenario) dumpLive() string {
	var b strings.Builder
	s.retry("dump live tasks", func(ctx context.Context) error {
		b.Reset()
		rows, err := s.pool.Query(ctx, s.q(`SELECT t.id, t.conversation_id, t.kind, t.status, t.phase, t.attempt,
				coalesce(t.token, 0), coalesce(c.holder, ''), c.epoch, coalesce(c.lease_expires_at::text, '')
			FROM {s}.tasks t JOIN {s}.conversation_leases c ON c.id = t.conversation_id
			WHERE t.status IN ('pending','running','waiting','sleeping','completing') ORDER BY t.id LIMIT 40`))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, token, epoch int64
			var conv, kind, status, phase, holder, expires string
			var attempt int
			if err := rows.Scan(&id, &conv, &kind, &status, &phase, &attempt, &token, &holder, &epoch, &expires); err != nil {
				return err
			}
			fmt.Fprintf(&b, "  #%d %s %s [%s] phase=%q attempt=%d token=%d holder=%q epoch=%d lease_expires=%s\n",
				id, conv, kind, status, phase, attempt, token, holder, epoch, expires)
		}
		return rows.Err()
	})
	return b.String()
}

// dumpTables writes the run log, the audit and the tasks as CSV files into
// the log folder, when the logs are kept (envKeepLogs): the evidence to
// read after a failure, since the schema is dropped with the test.
func (s *scenario) dumpTables() {
	if os.Getenv(envKeepLogs) == "" {
		return
	}
	for _, table := range []string{"run_log", "side_effects", "chaos_faults", "chaos_audit", "tasks", "conversations", "river_job"} {
		f, err := os.Create(filepath.Join(s.logDir, table+".csv"))
		require.NoError(s.t, err)
		s.retry("dump "+table, func(ctx context.Context) error {
			if err := f.Truncate(0); err != nil {
				return err
			}
			if _, err := f.Seek(0, 0); err != nil {
				return err
			}
			conn, err := s.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			_, err = conn.Conn().PgConn().CopyTo(ctx, f, s.q(`COPY (SELECT * FROM {s}.`+table+` ORDER BY 1) TO STDOUT WITH CSV HEADER`))
			return err
		})
		require.NoError(s.t, f.Close())
	}
}

// stopAll stops every runner process still alive, gracefully.
func (s *scenario) stopAll() {
	s.t.Helper()
	for _, c := range s.children {
		select {
		case <-c.done:
		default:
			s.stop(c)
		}
	}
}
