package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Bounds for a broken test, not expectations: every wait is on a
// condition.
const (
	settleWithin = 4 * time.Minute
	waitWithin   = 2 * time.Minute
	queryWithin  = 2 * time.Minute // a query of the test's, retried through a failover
)

// envKeepLogs names a folder to keep the runners' logs in, with the run
// log, the audit and the tasks as CSV (one folder per test).
const envKeepLogs = "ARBOR_FAILOVER_LOGS"

// appPrefix starts the application_name of every runner's arbor
// connections ("arbor-fo-" + node): what the audit trigger records as the
// writer of each row version. logPrefix starts that of its run log's pool.
const (
	appPrefix = "arbor-fo-"
	logPrefix = "fo-log-"
)

// Runner settings: a conversation lease far shorter than a failover, so
// that every failover outlasts it (as pg_auto_failover's default of some
// 50 s outlasts the default 15 s lease): the fence fires, the holder rows
// expire, and the runners take their conversations back on the new
// primary, one another's included. Short polls, as in internal/chaos.
const (
	lease        = 2 * time.Second
	pollInterval = 50 * time.Millisecond
	workers      = 32
	taskLease    = 5 * time.Second
	idleInTx     = 500 * time.Millisecond
)

// conversations is the workload's size in every scenario: 100 turns of
// thirteen tasks, under two runners.
const conversations = 100

// scenario is what a test needs: the cluster, a schema of its own (with
// the run log, the side effects, the faults and the audit trigger), the
// test's engine and pool, the turns it created, and the runners.
type scenario struct {
	t       *testing.T
	ctx     context.Context
	cluster *cluster
	primary string // the data node that was primary at the start
	pool    *pgxpool.Pool
	outside *pgxpool.Pool // the run log and the side effects, on the monitor's server
	schema  string
	engine  *tasks.Engine
	logDir  string
	began   time.Time
	convs   []string
	turns   []int64
	fans    []int
	nodes   []*node
	emitted atomic.Int32 // approvals emitted
	ackMu   sync.Mutex
	acked   map[int64]string // event id → conversation and time: every approval an Emit acknowledged

	mu    sync.Mutex
	wakes []wake // every wake a runner committed
}

// wake is a sleep or await timeout a runner woke.
type wake struct {
	at   time.Time
	node string
	by   machine.WakeSource
}

// options change a scenario's runners.
type options struct {
	// riverOnly turns the runners' local timers off: sleeps and await
	// timeouts are woken by River's jobs alone, so that a failover that
	// River did not come back from leaves them asleep.
	riverOnly bool
}

// setup waits for a healthy cluster (a primary and its synchronous
// standby), gives the test a migrated schema of its own with the run log,
// the side effects, the faults and the audit trigger, and starts two
// runners. The tests do not run in parallel (no t.Parallel): each fails
// the cluster over.
func setup(t *testing.T, o options) *scenario {
	c := requireCluster(t)
	primary := c.healthy()
	pool, schema := testdb.Fresh(t)
	s := &scenario{t: t, ctx: context.Background(), cluster: c, primary: primary, pool: pool, schema: schema,
		logDir: t.TempDir(), began: time.Now()}
	if dir := os.Getenv(envKeepLogs); dir != "" {
		s.logDir = filepath.Join(dir, t.Name())
		require.NoError(t, os.MkdirAll(s.logDir, 0o755))
		t.Logf("runner logs in %s", s.logDir)
	}
	s.requireOneClock()
	for _, ddl := range []string{runLogDDL, sideEffectsDDL, faultsDDL, auditDDL, leasesViewDDL} {
		s.exec(ddl)
	}
	s.outside = s.outsidePool("fo-test")
	for _, ddl := range []string{`CREATE SCHEMA {s}`, runLogDDL, sideEffectsDDL} {
		_, err := s.outside.Exec(s.ctx, s.q(ddl))
		require.NoError(t, err)
	}
	t.Cleanup(func() { _, _ = s.outside.Exec(context.Background(), s.q(`DROP SCHEMA {s} CASCADE`)) })
	engine, err := tasks.New(s.ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	s.engine = engine
	for _, name := range []string{"r1", "r2"} {
		s.startNode(name, o)
	}
	t.Logf("cluster: %s is the primary, %s its synchronous standby", primary, c.other(primary))
	return s
}

// requireOneClock checks what the proof's timestamps rest on, as
// internal/chaos does: the test, its runners and the database servers read
// one host's clock, so a time.Now() here and a server's
// clock_timestamp() are comparable — on the old primary and the new.
func (s *scenario) requireOneClock() {
	s.t.Helper()
	for range 3 {
		before := time.Now().Truncate(time.Microsecond)
		var server time.Time
		require.NoError(s.t, s.pool.QueryRow(s.ctx, `SELECT clock_timestamp()`).Scan(&server))
		after := time.Now().Add(time.Microsecond)
		require.False(s.t, server.Before(before) || server.After(after),
			"the database server's clock (%s) is not between two readings of this process's (%s, %s)", server, before, after)
	}
}

// node is a runner of the scenario: its own pools (arbor's, named
// appPrefix+name, and its run log's), engine and Runner, in this process.
type node struct {
	name   string
	pool   *pgxpool.Pool
	logs   *pgxpool.Pool
	runner *machine.Runner
	log    string
	file   *os.File
	done   bool
}

func (s *scenario) startNode(name string, o options) *node {
	t := s.t
	t.Helper()
	n := &node{name: name, log: filepath.Join(s.logDir, name+".log")}
	var err error
	n.file, err = os.Create(n.log)
	require.NoError(t, err)
	logger := slog.New(slog.NewJSONHandler(n.file, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n.pool = s.namedPool(appPrefix + name)
	n.logs = s.outsidePool(logPrefix + name)
	// The engine's defaults (UnavailableTimeout 30 s among them), as an
	// application's, but for the short leases above.
	engine, err := tasks.New(s.ctx, n.pool, &tasks.Config{Schema: s.schema, TaskLease: taskLease, IdleInTransaction: idleInTx, Logger: logger})
	require.NoError(t, err)
	w := &worker{logs: n.logs, schema: s.schema, node: name, engine: engine}
	n.runner, err = machine.NewRunner(engine, w.handlers(), &machine.RunnerConfig{
		NodeID:            name,
		Workers:           workers,
		ConversationLease: lease,
		PollInterval:      pollInterval,
		IdleRelease:       300 * time.Millisecond,
		ShutdownGrace:     5 * time.Second,
		// A wake job left running by a client cut off mid-job is rescued
		// after 10 s (docs/operations.md, "High availability").
		Waker: &machine.WakerConfig{RiverTestOnly: true, DisableTimers: o.riverOnly, RescueStuckJobsAfter: 10 * time.Second, OnWake: func(e machine.Wake) {
			s.mu.Lock()
			s.wakes = append(s.wakes, wake{at: time.Now(), node: name, by: e.By})
			s.mu.Unlock()
		}},
		Logger: logger,
	})
	require.NoError(t, err)
	require.NoError(t, n.runner.Start(s.ctx))
	s.nodes = append(s.nodes, n)
	t.Cleanup(func() { s.stopNode(n) })
	return n
}

// namedPool opens a pool on the cluster (ARBOR_DATABASE_URL: both data
// nodes, target_session_attrs=read-write) whose connections carry
// application_name app, closed when the test ends.
func (s *scenario) namedPool(app string) *pgxpool.Pool {
	s.t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(s.t))
	require.NoError(s.t, err)
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(s.ctx, cfg)
	require.NoError(s.t, err)
	s.t.Cleanup(pool.Close)
	return pool
}

// envOutside names the database that stands for the outside world: on
// the monitor's server, which no fault touches (the cluster script
// exports it). The handlers' run log and side effects go there, so that
// a handler records its return at once, whatever the cluster does, and
// returns; verify copies them into the scenario's schema for the proof.
const envOutside = "ARBOR_FAILOVER_OUTSIDE_URL"

func (s *scenario) outsidePool(app string) *pgxpool.Pool {
	s.t.Helper()
	url := os.Getenv(envOutside)
	require.NotEmpty(s.t, url, "%s is set by scripts/with-failover-cluster.sh", envOutside)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(s.t, err)
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(s.ctx, cfg)
	require.NoError(s.t, err)
	s.t.Cleanup(pool.Close)
	return pool
}

// importLogs copies the run log and the side effects from the outside
// database into the scenario's schema, where the proof's queries join them
// with the audit and the tasks.
func (s *scenario) importLogs() {
	s.t.Helper()
	for _, table := range []string{"run_log", "side_effects"} {
		rows, err := s.outside.Query(s.ctx, s.q(`SELECT * FROM {s}.`+table))
		require.NoError(s.t, err)
		var cols []string
		for _, fd := range rows.FieldDescriptions() {
			cols = append(cols, fd.Name)
		}
		var all [][]any
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(s.t, err)
			all = append(all, v)
		}
		require.NoError(s.t, rows.Err())
		s.retry("import "+table, func(ctx context.Context) error {
			tx, err := s.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, s.q(`TRUNCATE {s}.`+table)); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.schema, table}, cols, pgx.CopyFromRows(all)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	}
}

// stopNode stops a runner gracefully and requires a clean stop: every
// handler returned and every lease released.
func (s *scenario) stopNode(n *node) {
	if n.done {
		return
	}
	n.done = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := n.runner.Stop(ctx)
	_ = n.file.Close()
	require.NoError(s.t, err, "runner %s stops cleanly", n.name)
}

func (s *scenario) stopAll() {
	for _, n := range s.nodes {
		s.stopNode(n)
	}
}

// addTurns creates n more conversations of one turn each, each with a
// budget of budgetMax tokens; fan, when not nil, gives the number of
// leaves the i-th spawns beside its tree. Every other conversation gets
// its approval at once (before its agent awaits it: the await takes it
// when it parks); the others get it from emitRest.
func (s *scenario) addTurns(n int, fan func(i int) int) {
	s.t.Helper()
	for range n {
		i := len(s.convs)
		k := 0
		if fan != nil {
			k = fan(i)
		}
		conv := fmt.Sprintf("fo-%04d", i)
		in, _ := json.Marshal(map[string]any{"value": map[string]any{"name": "turn", "fan": k, "i": i}})
		var turn arbortype.Task
		s.retry("create "+conv, func(ctx context.Context) error {
			var err error
			turn, _, err = s.engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: turnKind, Input: in,
				IdempotencyKey: "turn"})
			return err
		})
		s.retry("budget "+conv, func(ctx context.Context) error {
			_, err := s.engine.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv, Counter: tokenCounter, Max: budgetMax})
			return err
		})
		s.convs = append(s.convs, conv)
		s.turns = append(s.turns, turn.ID)
		s.fans = append(s.fans, k)
		if i%2 == 0 {
			require.NoError(s.t, s.approve(conv))
		}
	}
}

// approve emits the approval a conversation's agent awaits, once (a
// first-wins name with a key: an emit retried after ErrAmbiguous or
// ErrUnavailable is the same emit).
func (s *scenario) approve(conv string) error {
	var tries []string
	err := s.try("approve "+conv, func(ctx context.Context) error {
		ev, created, err := s.engine.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: approveEvent,
			Payload: json.RawMessage(fmt.Sprintf(`{"answer": %q}`, "yes-"+conv)), IdempotencyKey: "approve"})
		if err != nil {
			tries = append(tries, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
		} else {
			s.ackMu.Lock()
			if s.acked == nil {
				s.acked = map[int64]string{}
			}
			s.acked[ev.ID] = conv + " at " + time.Now().Format("15:04:05.000")
			s.ackMu.Unlock()
		}
		if err == nil && len(tries) > 0 {
			tries = append(tries, fmt.Sprintf("%s: event %d (created %v)", time.Now().Format("15:04:05.000"), ev.ID, created))
		}
		return err
	})
	if len(tries) > 0 {
		// What a failover made of an emit: kept for a failure's diagnosis.
		s.t.Logf("approve %s, retried: %s", conv, strings.Join(tries, "; "))
	}
	if err == nil {
		s.emitted.Add(1)
	}
	return err
}

// emitRest emits, one by one, the approvals addTurns left: called as the
// fault comes, so that they go on through the failover. It runs on a
// goroutine of its own, so it returns what failed rather than failing the
// test (FailNow must be called from the test's goroutine).
func (s *scenario) emitRest() error {
	var errs []error
	for i, conv := range s.convs {
		if i%2 == 1 {
			errs = append(errs, s.approve(conv))
		}
	}
	return errors.Join(errs...)
}

// The run log, the side effects, the faults and the audit: internal/chaos's
// (harness_test.go there says what each column means), and the audit
// records the port of the server that wrote each row version
// (inet_server_port(): the node), which tells the old primary's writes
// from the new one's.
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

// chaos_faults: the faults of the scenario, by the test's clock. No
// runner is killed, frozen or cut, so none explains a restart: the
// proof's queries (verify_test.go) find every restart unexplained.
const faultsDDL = `CREATE TABLE {s}.chaos_faults (
	id              serial PRIMARY KEY,
	kind            text NOT NULL,
	node            text,
	conversation_id text,
	from_at         timestamptz NOT NULL,
	to_at           timestamptz NOT NULL)`

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
	server_port   integer NOT NULL DEFAULT inet_server_port(),
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

const leasesViewDDL = `CREATE VIEW {s}.conversation_leases AS
	SELECT c.id, c.holder, c.epoch, h.expires_at AS lease_expires_at
	FROM {s}.conversations c LEFT JOIN {s}.holders h ON h.id = c.holder_id`

// fault records a fault and its window.
func (s *scenario) fault(kind, node string, from, to time.Time) {
	s.t.Helper()
	s.exec(`INSERT INTO {s}.chaos_faults (kind, node, from_at, to_at) VALUES ($1, nullif($2, ''), $3, $4)`, kind, node, from, to)
}

// q puts the scenario's schema into a statement.
func (s *scenario) q(sql string) string {
	return strings.ReplaceAll(sql, "{s}", pgx.Identifier{s.schema}.Sanitize())
}

// retry runs fn until it succeeds, again after each error for
// queryWithin: the test's own calls go on through a failover.
func (s *scenario) retry(what string, fn func(ctx context.Context) error) {
	s.t.Helper()
	require.NoError(s.t, s.try(what, fn))
}

// try is retry for a goroutine other than the test's: it returns the last
// error once queryWithin has passed.
func (s *scenario) try(what string, fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(queryWithin)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(s.ctx, 45*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
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

// waitFor polls cond until it holds; the bound is for a broken test.
func (s *scenario) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(waitWithin)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; live tasks:\n%s", what, s.dumpLive(40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runs is how many handler calls the run log has: the workload's progress.
func (s *scenario) runs() int {
	var n int
	s.retry("runs", func(ctx context.Context) error {
		return s.outside.QueryRow(ctx, s.q(`SELECT count(*) FROM {s}.run_log`)).Scan(&n)
	})
	return n
}

func (s *scenario) live() int {
	return s.count(`SELECT count(*) FROM {s}.tasks WHERE status IN ('pending','running','waiting','sleeping','completing')`)
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
			warns, _, _ := s.logSummary()
			var log strings.Builder
			for _, msg := range slices.Sorted(maps.Keys(warns)) {
				fmt.Fprintf(&log, "%5d × %s\n", warns[msg], msg)
			}
			s.dumpTables()
			s.t.Logf("goroutines of the runners waiting on the database:\n%s", s.dumpGoroutines())
			s.t.Fatalf("lost work: tasks still live %s after the start:\n%s\nrunner sessions:\n%s\nrunner log:\n%s\n%s\nevents of the conversations still live:\n%s\nmonitor events:\n%s",
				time.Since(s.began).Round(time.Second), s.dumpLive(200), s.dumpSessions(), log.String(), s.lostEmits(),
				strings.Join(s.rows(`SELECT e.id, e.conversation_id, e.task_id, e.name, e.idempotency_key, e.emitted_at, e.delivered_to, e.delivered_at
					FROM {s}.events e WHERE e.conversation_id IN (SELECT conversation_id FROM {s}.tasks
						WHERE status IN ('pending','running','waiting','sleeping','completing'))
					ORDER BY e.id LIMIT 200`), "\n"),
				s.cluster.events())
		}
		if n := s.runs(); n != last {
			last, since, told = n, time.Now(), false
		} else if !told && time.Since(since) > 5*time.Second {
			told = true
			s.t.Logf("no handler call for 5 s with tasks live:\n%s\nrunner sessions:\n%s", s.dumpLive(40), s.dumpSessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lostEmits names the acknowledged approvals whose event is not in the
// database: an Emit that returned its event, which the failover then
// lost. Empty when every one is there.
func (s *scenario) lostEmits() string {
	s.ackMu.Lock()
	ids := slices.Sorted(maps.Keys(s.acked))
	acked := maps.Clone(s.acked)
	s.ackMu.Unlock()
	var found []int64
	s.retry("acknowledged events", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, s.q(`SELECT id FROM {s}.events WHERE id = ANY($1)`), ids)
		if err != nil {
			return err
		}
		found, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	var lost []string
	for _, id := range ids {
		if !slices.Contains(found, id) {
			lost = append(lost, fmt.Sprintf("event %d (%s)", id, acked[id]))
		}
	}
	if len(lost) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d acknowledged approvals are not in the database: %s", len(lost), len(ids), strings.Join(lost, ", "))
}

// dumpSessions describes the runners' sessions that are not idle.
func (s *scenario) dumpSessions() string {
	return strings.Join(s.rows(`SELECT pid, application_name AS app, state, (now() - xact_start)::text AS xact_age,
			wait_event_type, wait_event, left(query, 120) AS query
		FROM pg_stat_activity WHERE application_name LIKE '`+appPrefix+`%' AND state <> 'idle' ORDER BY xact_start`), "\n")
}

// dumpLive describes the live tasks and their conversations' holders.
func (s *scenario) dumpLive(limit int) string {
	return strings.Join(s.rows(`SELECT t.id, t.conversation_id, t.kind, t.status, t.phase, t.attempt,
			coalesce(t.token, 0) AS token, coalesce(c.holder, '') AS holder, c.epoch, c.lease_expires_at
		FROM {s}.tasks t JOIN {s}.conversation_leases c ON c.id = t.conversation_id
		WHERE t.status IN ('pending','running','waiting','sleeping','completing') ORDER BY t.id LIMIT `+strconv.Itoa(limit)), "\n") +
		"\nwake jobs of sleeping tasks:\n" + strings.Join(s.rows(`SELECT j.id, (j.args->>'task_id')::bigint AS task_id, j.state::text AS state,
			j.attempt, j.attempted_at, j.scheduled_at, j.attempted_by
		FROM {s}.river_job j JOIN {s}.tasks t ON t.id = (j.args->>'task_id')::bigint
		WHERE j.kind = 'arbor_wake' AND t.status = 'sleeping' ORDER BY j.id LIMIT 40`), "\n")
}

// dumpGoroutines writes every goroutine's stack into the log folder (or
// the test's temporary one) and returns those of arbor's that wait inside
// pgx: where a run's end, a flush or a claim is stuck on the database.
func (s *scenario) dumpGoroutines() string {
	var all bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&all, 2)
	_ = os.WriteFile(filepath.Join(s.logDir, "goroutines.txt"), all.Bytes(), 0o644)
	var out []string
	for _, g := range strings.Split(all.String(), "\n\n") {
		if strings.Contains(g, "jackc/pgx") && strings.Contains(g, "arborhq/arbor/") {
			out = append(out, g)
		}
	}
	return fmt.Sprintf("%d goroutines (all in %s):\n%s", len(out), filepath.Join(s.logDir, "goroutines.txt"), strings.Join(out, "\n\n"))
}

// dumpTables writes the run log, the audit and the tasks as CSV files into
// the log folder, when the logs are kept (envKeepLogs).
func (s *scenario) dumpTables() {
	if os.Getenv(envKeepLogs) == "" {
		return
	}
	for _, table := range []string{"run_log", "side_effects", "chaos_faults", "chaos_audit", "tasks", "conversations", "events", "river_job"} {
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

// followers are clients waiting on turns through the test's engine —
// AwaitSettled, which follows the conversation's log through the engine's
// LISTEN — while the failover happens: each must return once its turn
// settled, none left hanging on a LISTEN of the old primary.
type followers struct {
	turns    []int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	returned map[int64]time.Time
	errs     []error
}

func (s *scenario) follow(turns []int64) *followers {
	f := &followers{turns: turns, returned: map[int64]time.Time{}}
	ctx, cancel := context.WithTimeout(s.ctx, settleWithin)
	s.t.Cleanup(cancel)
	for _, id := range turns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for {
				_, err := s.engine.AwaitSettled(ctx, id)
				if err == nil || ctx.Err() != nil {
					f.mu.Lock()
					if err == nil {
						f.returned[id] = time.Now()
					} else {
						f.errs = append(f.errs, fmt.Errorf("turn %d: %w", id, err))
					}
					f.mu.Unlock()
					return
				}
				// ErrUnavailable after UnavailableTimeout: a follower retries,
				// as a client does; counted.
				f.mu.Lock()
				f.errs = append(f.errs, fmt.Errorf("turn %d (retried): %w", id, err))
				f.mu.Unlock()
				if !errors.Is(err, arbortype.ErrUnavailable) {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	return f
}

// followerLag waits for the followers and returns the largest time
// between a turn's settle (its settled_at, by the database's clock on this
// host) and its follower's return, the followers that never returned, and
// the errors they saw (and retried).
func (s *scenario) followerLag(f *followers) (worst time.Duration, hanging int, errs []error) {
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitWithin):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	settled := map[int64]time.Time{}
	s.retry("settled_at", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, s.q(`SELECT id, settled_at FROM {s}.tasks WHERE id = ANY($1) AND settled_at IS NOT NULL`), f.turns)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				return err
			}
			settled[id] = at
		}
		return rows.Err()
	})
	for id, at := range f.returned {
		worst = max(worst, at.Sub(settled[id]))
	}
	return worst, len(f.turns) - len(f.returned), append([]error(nil), f.errs...)
}
