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

// scenario is what a test needs: its own schema (with the run log and the
// audit trigger), the test's engine and pool, the turns it created, and the
// runner processes it started.
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
	children []*child
}

// setup gives a test a migrated schema of its own with the run log and the
// audit trigger, and creates conversations turns, one turn each. The tests
// do not run in parallel (no t.Parallel): one of them restarts the
// database server, which would hit every other test sharing it, and on a
// two-core machine parallel runner processes would starve each other into
// lease losses that belong to no scenario.
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
	for _, ddl := range []string{runLogDDL, nodesDDL, auditDDL} {
		s.exec(ddl)
	}
	engine, err := tasks.New(s.ctx, pool, &tasks.Config{Schema: schema, RestartLimit: restartSafe})
	require.NoError(t, err)
	s.engine = engine
	in, _ := json.Marshal(map[string]any{"value": map[string]any{"name": "turn"}})
	for i := range conversations {
		conv := fmt.Sprintf("chaos-%03d", i)
		turn, _, err := engine.Create(s.ctx, tasks.CreateParams{ConversationID: conv, Kind: turnKind, Input: in})
		require.NoError(t, err)
		s.convs = append(s.convs, conv)
		s.turns = append(s.turns, turn.ID)
	}
	return s
}

// The run log: one row per call of a handler, written by the handler on
// its runner's pool in statements of its own (not in arbor's
// transactions). ended_at is when the call issued its ending write (or
// returned its error); null when its process died first (chaos_nodes says
// when). refused counts the writes of the call that arbor refused.
const runLogDDL = `CREATE TABLE {s}.run_log (
	id         bigint PRIMARY KEY,
	task_id    bigint NOT NULL,
	token      bigint NOT NULL,
	node       text NOT NULL,
	kind       text NOT NULL,
	attempt    integer NOT NULL,
	started_at timestamptz NOT NULL,
	ended_at   timestamptz,
	outcome    text,
	refused    integer NOT NULL DEFAULT 0);
CREATE INDEX ON {s}.run_log (task_id)`

// chaos_nodes: when each killed runner process was gone.
const nodesDDL = `CREATE TABLE {s}.chaos_nodes (node text PRIMARY KEY, died_at timestamptz NOT NULL)`

// The audit: a row for every task row version that matters, written by a
// trigger in the transaction that wrote the version — so it commits, or
// not, with it. For a write that carries a run's stamp ({"by": {token,
// node}} in a result, state or child input; "(token N)" ending an error
// message) it records that token next to the task's token at that moment
// (old_token; for a spawn, the owner's token and status): a write from a
// run whose token was no longer current would show as by_token ≠ old_token.
// For a start (→ running) it records the run's epoch next to the
// conversation's holder and epoch at that moment. For every change of
// status or token it records the transition, so the moment each token died
// is known. app is the writer's application_name: which process wrote.
// Heartbeats (no status, token or document change) are left out.
const auditDDL = `CREATE TABLE {s}.chaos_audit (
	id            bigserial PRIMARY KEY,
	task_id       bigint NOT NULL,
	op            text NOT NULL,
	old_status    text,
	new_status    text NOT NULL,
	old_token     bigint,
	new_token     bigint,
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
	IF TG_OP = 'UPDATE' AND v_by IS NULL AND NEW.status = OLD.status AND NEW.token IS NOT DISTINCT FROM OLD.token THEN
		RETURN NULL;
	END IF;
	IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
		SELECT c.holder, c.epoch INTO v_holder, v_epoch FROM {s}.conversations c WHERE c.id = NEW.conversation_id;
	END IF;
	INSERT INTO {s}.chaos_audit (task_id, op, old_status, new_status, old_token, new_token, by_token, by_node,
		owner_status, owner_token, new_run_epoch, conv_holder, conv_epoch, app)
	VALUES (NEW.id, lower(TG_OP), CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
		CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token, v_by, v_node, v_ostatus, v_otoken,
		NEW.run_epoch, v_holder, v_epoch, current_setting('application_name'));
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON {s}.tasks FOR EACH ROW EXECUTE FUNCTION {s}.chaos_audit()`

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

// now is the database's clock.
func (s *scenario) now() time.Time {
	s.t.Helper()
	var at time.Time
	s.retry("clock", func(ctx context.Context) error { return s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at) })
	return at
}

// waitFor polls cond until it holds; the bound is for a broken test,
// which fails with the live tasks and the runners' sessions.
func (s *scenario) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(waitWithin)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; live tasks:\n%s\nrunner sessions:\n%s", what, s.dumpLive(), s.dumpSessions())
		}
		time.Sleep(20 * time.Millisecond)
	}
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
			FROM {s}.tasks t JOIN {s}.conversations c ON c.id = t.conversation_id
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
	for _, table := range []string{"run_log", "chaos_audit", "tasks", "conversations", "river_job"} {
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
