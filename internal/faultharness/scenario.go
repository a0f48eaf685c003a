package faultharness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	// SettleWithin bounds WaitSettled.
	SettleWithin = 4 * time.Minute
	// WaitWithin bounds WaitFor.
	WaitWithin  = 2 * time.Minute
	queryWithin = 2 * time.Minute // a query of the test's, retried through a restart or a failover
)

// Config is what tells one suite's scenarios from the other's.
type Config struct {
	// AppPrefix starts the application_name of every runner's arbor
	// connections (AppPrefix + the runner's NodeID): what the audit
	// records as the writer of each row version, and what the proof holds
	// each run's writes and starts to.
	AppPrefix string
	// Conversations prefixes the conversations' ids ("chaos" makes
	// "chaos-0000", "chaos-0001"…).
	Conversations string
	// KeepLogsEnv names the environment variable that, when set, names a
	// folder to keep the runners' logs in, with the run log, the audit and
	// the tasks as CSV (one folder per test); by default the logs go to the
	// test's temporary folder, and the tables with its schema.
	KeepLogsEnv string
	// Awaits gives every turn's tree an agent and a waiter (see the
	// workload) and every conversation a budget of budgetMax tokens; every
	// other conversation gets its approval at once (AddTurns), the others
	// from EmitRest.
	Awaits bool
	// DatabaseFaultsOnly says that the scenarios' faults are the
	// database's alone (a failover): no runner is killed, frozen or cut, so
	// no fault explains a restart, and every restart counted fails the
	// proof; an abandon_on_restart run that the fault cut is settled
	// abandoned_on_restart by whichever recovery comes, counted or not: its
	// designed end, counted apart (figures' abandonedRecoveries) instead.
	DatabaseFaultsOnly bool
	// Tenants, when not empty, spreads the conversations over these
	// tenants, round robin (the i-th conversation's tenant is
	// Tenants[i % len(Tenants)]).
	Tenants []string
	// ToolKey, when not empty, is the ConcurrencyKey every turn's tool
	// calls (tool0, tool1 and the stubborn tool2) are spawned with: the
	// limit "key:"+ToolKey bounds them (see VerifyLimits).
	ToolKey string
}

// Scenario is what a fault test needs: its own schema (with the run log,
// the side effects, the faults and the audit trigger), the test's engine
// and pool, the turns it created and the runners' logs. Its methods retry
// the test's own queries through a restart or a failover.
type Scenario struct {
	T      *testing.T
	Ctx    context.Context
	Pool   *pgxpool.Pool
	Schema string
	Engine *tasks.Engine
	// LogDir holds the runners' logs (Config.KeepLogsEnv).
	LogDir string
	Began  time.Time
	// Convs and Turns are the conversations AddTurns created (or
	// AdoptTurn added) and the id of each one's turn.
	Convs []string
	Turns []int64
	// OnceLeaves makes the leaves of the turns AddTurns creates from then
	// on abandon_on_restart (see the workload).
	OnceLeaves bool
	// Diagnose, when set, adds to the report of a scenario whose work is
	// lost (the cluster's history, say).
	Diagnose func() string

	cfg     Config
	fans    []int // the leaves each turn spawns (0: none)
	outside *pgxpool.Pool
	logs    []runnerLog

	ackMu sync.Mutex
	acked map[int64]string // event id → conversation and time: every approval an Emit acknowledged
}

// runnerLog is the JSON log file of a runner.
type runnerLog struct{ node, path string }

// New gives a test a migrated schema of its own with the run log, the side
// effects, the faults and the audit trigger, and an engine on it at its
// defaults. The tests do not run in parallel (no t.Parallel): their faults
// hit every test sharing the server or the machine.
func New(t *testing.T, cfg Config) *Scenario {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	s := &Scenario{T: t, Ctx: context.Background(), Pool: pool, Schema: schema, LogDir: t.TempDir(), Began: time.Now(), cfg: cfg}
	if dir := os.Getenv(cfg.KeepLogsEnv); cfg.KeepLogsEnv != "" && dir != "" {
		s.LogDir = filepath.Join(dir, t.Name())
		require.NoError(t, os.MkdirAll(s.LogDir, 0o755))
		t.Logf("runner logs in %s", s.LogDir)
	}
	s.requireOneClock()
	for _, ddl := range []string{runLogDDL, sideEffectsDDL, faultsDDL, auditDDL, leasesViewDDL} {
		s.Exec(ddl)
	}
	engine, err := tasks.New(s.Ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	s.Engine = engine
	return s
}

// requireOneClock checks what the proof's timestamps rest on: the test
// process, the runners and the database servers run on one host and read
// one clock (CLOCK_REALTIME), so a time.Now() of any of them and a
// server's clock_timestamp() are comparable — on a cluster, on the old
// primary and the new. The handlers stamp their entry, their return and
// their side effects with time.Now() at the moment itself, not with the
// server's clock at the moment the statement that records it arrives:
// under a blackholed route, a frozen process or a restarting server that
// statement comes late, and a late stamp would move a return after a later
// call's entry that it preceded. A server on another host
// (ARBOR_DATABASE_URL) would break this, so it is checked: the server's
// clock is read between two readings of ours.
func (s *Scenario) requireOneClock() {
	s.T.Helper()
	for range 3 {
		before := time.Now().Truncate(time.Microsecond)
		var server time.Time
		require.NoError(s.T, s.Pool.QueryRow(s.Ctx, `SELECT clock_timestamp()`).Scan(&server))
		after := time.Now().Add(time.Microsecond)
		require.False(s.T, server.Before(before) || server.After(after),
			"the database server's clock (%s) is not between two readings of this process's (%s, %s): the proof compares timestamps of both, so they must share one host's clock",
			server, before, after)
	}
}

// UseOutside puts the run log and the side effects on outside, a database
// that stands for the outside world and that no fault touches (on a
// cluster, the monitor's server), in a schema of the scenario's name:
// the runners' workers log there (NewWorker(outside, …)), and Verify
// copies both into the scenario's schema, where the proof's queries join
// them with the audit and the tasks.
func (s *Scenario) UseOutside(outside *pgxpool.Pool) {
	s.T.Helper()
	for _, ddl := range []string{`CREATE SCHEMA {s}`, runLogDDL, sideEffectsDDL} {
		_, err := outside.Exec(s.Ctx, s.Q(ddl))
		require.NoError(s.T, err)
	}
	s.T.Cleanup(func() { _, _ = outside.Exec(context.Background(), s.Q(`DROP SCHEMA {s} CASCADE`)) })
	s.outside = outside
}

// importLogs copies the run log and the side effects from the outside
// database into the scenario's schema (UseOutside).
func (s *Scenario) importLogs() {
	s.T.Helper()
	for _, table := range []string{"run_log", "side_effects"} {
		rows, err := s.outside.Query(s.Ctx, s.Q(`SELECT * FROM {s}.`+table))
		require.NoError(s.T, err)
		var cols []string
		for _, fd := range rows.FieldDescriptions() {
			cols = append(cols, fd.Name)
		}
		var all [][]any
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(s.T, err)
			all = append(all, v)
		}
		require.NoError(s.T, rows.Err())
		s.Retry("import "+table, func(ctx context.Context) error {
			tx, err := s.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, s.Q(`TRUNCATE {s}.`+table)); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.Schema, table}, cols, pgx.CopyFromRows(all)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	}
}

// AddRunnerLog names the JSON log file of the runner node, which the
// figures (give-ups, warnings) and the reports of a broken test read.
func (s *Scenario) AddRunnerLog(node, path string) {
	s.logs = append(s.logs, runnerLog{node: node, path: path})
}

// AddTurns creates n more conversations of one turn each; fan, when not
// nil, gives the number of leaves the i-th of them spawns beside its tree
// (see the workload). With Config.Awaits, each conversation gets a budget
// of budgetMax tokens, and every other one its approval at once (before
// its agent awaits it: the await takes it when it parks); EmitRest emits
// the others'.
func (s *Scenario) AddTurns(n int, fan func(i int) int) {
	s.T.Helper()
	for range n {
		i := len(s.Convs)
		k := 0
		if fan != nil {
			k = fan(i)
		}
		conv := fmt.Sprintf("%s-%04d", s.cfg.Conversations, i)
		in, _ := json.Marshal(map[string]any{"value": turnInput{Name: "turn", Fan: k, OnceLeaves: s.OnceLeaves, Awaits: s.cfg.Awaits, I: i,
			ToolKey: s.cfg.ToolKey}})
		var tenant string
		if len(s.cfg.Tenants) > 0 {
			tenant = s.cfg.Tenants[i%len(s.cfg.Tenants)]
		}
		var turn arbortype.Task
		s.Retry("create "+conv, func(ctx context.Context) error {
			var err error
			turn, _, err = s.Engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: turnKind, Input: in,
				IdempotencyKey: "turn", Tenant: tenant})
			return err
		})
		if s.cfg.Awaits {
			s.Retry("budget "+conv, func(ctx context.Context) error {
				_, err := s.Engine.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv, Counter: tokenCounter, Max: budgetMax})
				return err
			})
		}
		s.Convs = append(s.Convs, conv)
		s.Turns = append(s.Turns, turn.ID)
		s.fans = append(s.fans, k)
		if s.cfg.Awaits && i%2 == 0 {
			require.NoError(s.T, s.approve(conv))
		}
	}
}

// TurnCreate is the create of a conversation's turn as AddTurns makes it
// (no fan-out, no awaits, no tenant, no tool key), i its index: for a
// scenario whose runner processes create their own turns, each then given
// to the scenario with AdoptTurn. Its idempotency key ("turn") makes a
// create issued again after ErrAmbiguous, or after its caller died, the
// same create.
func TurnCreate(conv string, i int) arbortype.CreateParams {
	in, _ := json.Marshal(map[string]any{"value": turnInput{Name: "turn", I: i}})
	return arbortype.CreateParams{ConversationID: conv, Kind: turnKind, Input: in, IdempotencyKey: "turn"}
}

// AdoptTurn adds to the scenario a conversation whose turn (created with
// TurnCreate, by a process of the scenario's own) is turn: Verify proves it
// as one of AddTurns'. Not with Config.Awaits, tenants or a tool key.
func (s *Scenario) AdoptTurn(conv string, turn int64) {
	s.T.Helper()
	require.False(s.T, s.cfg.Awaits || len(s.cfg.Tenants) > 0 || s.cfg.ToolKey != "",
		"an adopted turn has no awaits, tenant or tool key")
	s.Convs = append(s.Convs, conv)
	s.Turns = append(s.Turns, turn)
	s.fans = append(s.fans, 0)
}

// approve emits the approval a conversation's agent awaits, once (a
// first-wins name with a key: an emit retried after ErrAmbiguous or
// ErrUnavailable is the same emit), and keeps the event of each Emit that
// returned one: Verify requires every one in the database.
func (s *Scenario) approve(conv string) error {
	var tries []string
	err := s.Try("approve "+conv, func(ctx context.Context) error {
		ev, created, err := s.Engine.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: approveEvent,
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
		// What a fault made of an emit: kept for a failure's diagnosis.
		s.T.Logf("approve %s, retried: %s", conv, strings.Join(tries, "; "))
	}
	return err
}

// EmitRest emits, one by one, the approvals AddTurns left: called as the
// fault comes, so that they go on through it. It may run on a goroutine of
// its own, so it returns what failed rather than failing the test
// (FailNow must be called from the test's goroutine).
func (s *Scenario) EmitRest() error {
	var errs []error
	for i, conv := range s.Convs {
		if i%2 == 1 {
			errs = append(errs, s.approve(conv))
		}
	}
	return errors.Join(errs...)
}

// lostEmits names the acknowledged approvals whose event is not in the
// database: an Emit that returned its event, which a fault then lost.
// Empty when every one is there.
func (s *Scenario) lostEmits() string {
	s.ackMu.Lock()
	ids := slices.Sorted(maps.Keys(s.acked))
	acked := maps.Clone(s.acked)
	s.ackMu.Unlock()
	if len(ids) == 0 {
		return ""
	}
	var found []int64
	s.Retry("acknowledged events", func(ctx context.Context) error {
		rows, err := s.Pool.Query(ctx, s.Q(`SELECT id FROM {s}.events WHERE id = ANY($1)`), ids)
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

// Q puts the scenario's schema into a statement ({s}), and the runners'
// application_name prefix ({app}).
func (s *Scenario) Q(sql string) string {
	sql = strings.ReplaceAll(sql, "{app}", s.cfg.AppPrefix)
	return strings.ReplaceAll(sql, "{s}", pgx.Identifier{s.Schema}.Sanitize())
}

// Retry runs fn until it succeeds, again after each error for
// queryWithin: the test's own queries go on through a restart of the
// server or a failover.
func (s *Scenario) Retry(what string, fn func(ctx context.Context) error) {
	s.T.Helper()
	require.NoError(s.T, s.Try(what, fn))
}

// Try is Retry for a goroutine other than the test's: it returns the last
// error once queryWithin has passed.
func (s *Scenario) Try(what string, fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(queryWithin)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(s.Ctx, 45*time.Second)
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

// Exec runs a statement (Q'd).
func (s *Scenario) Exec(sql string, args ...any) {
	s.T.Helper()
	s.Retry(sql, func(ctx context.Context) error {
		_, err := s.Pool.Exec(ctx, s.Q(sql), args...)
		return err
	})
}

// Count runs a query that returns one integer.
func (s *Scenario) Count(sql string, args ...any) int {
	s.T.Helper()
	var n int
	s.Retry(sql, func(ctx context.Context) error { return s.Pool.QueryRow(ctx, s.Q(sql), args...).Scan(&n) })
	return n
}

// Rows runs a query and returns each row as text.
func (s *Scenario) Rows(sql string, args ...any) []string {
	var out []string
	s.Retry(sql, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.Pool.Query(ctx, s.Q(sql), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				if tv, ok := v.(time.Time); ok {
					v = tv.Format("15:04:05.000000")
				}
				parts[i] = fmt.Sprintf("%s=%v", rows.FieldDescriptions()[i].Name, v)
			}
			out = append(out, strings.Join(parts, " "))
		}
		return rows.Err()
	})
	return out
}

// Column runs a query that returns one text column.
func (s *Scenario) Column(sql string, args ...any) []string {
	var out []string
	s.Retry(sql, func(ctx context.Context) error {
		rows, err := s.Pool.Query(ctx, s.Q(sql), args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return out
}

// WaitFor polls cond until it holds; the bound (WaitWithin) is for a
// broken test, which fails with the live tasks, the runners' sessions and
// the ends of their logs.
func (s *Scenario) WaitFor(what string, cond func() bool) {
	s.T.Helper()
	deadline := time.Now().Add(WaitWithin)
	for !cond() {
		if time.Now().After(deadline) {
			s.T.Fatalf("timed out waiting for %s; live tasks:\n%s\nrunner sessions:\n%s%s", what, s.dumpLive(40), s.dumpSessions(), s.dumpLogs(15))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dumpLogs is the last n lines of each runner's log.
func (s *Scenario) dumpLogs(n int) string {
	var b strings.Builder
	for _, l := range s.logs {
		fmt.Fprintf(&b, "\nrunner %s's log, its last %d lines:\n%s\n", l.node, n, Tail(l.path, n))
	}
	return b.String()
}

// dumpSessions describes the runners' sessions that are not idle.
func (s *Scenario) dumpSessions() string {
	return strings.Join(s.Rows(`SELECT pid, application_name AS app, state, (now() - xact_start)::text AS xact_age,
			wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, left(query, 120) AS query
		FROM pg_stat_activity WHERE application_name LIKE '{app}%' AND state <> 'idle' ORDER BY xact_start`), "\n")
}

// Runs is how many handler calls the run log has: the workload's progress.
func (s *Scenario) Runs() int {
	db := s.Pool
	if s.outside != nil {
		db = s.outside
	}
	var n int
	s.Retry("runs", func(ctx context.Context) error {
		return db.QueryRow(ctx, s.Q(`SELECT count(*) FROM {s}.run_log`)).Scan(&n)
	})
	return n
}

// Live is how many tasks are not settled.
func (s *Scenario) Live() int {
	return s.Count(`SELECT count(*) FROM {s}.tasks WHERE status IN ('pending','running','waiting','sleeping','completing')`)
}

// WaitProgress waits until n more handler calls were logged than from,
// or the workload is done; it returns the calls logged by then.
func (s *Scenario) WaitProgress(from, n int) int {
	s.T.Helper()
	var now int
	s.WaitFor(fmt.Sprintf("%d more runs", n), func() bool {
		now = s.Runs()
		return now >= from+n || s.Done()
	})
	return now
}

// Done reports whether every turn settled and nothing is live.
func (s *Scenario) Done() bool { return s.Live() == 0 && len(s.Turns) > 0 }

// WaitSettled waits until every task settled, or fails the test (after
// SettleWithin) with the tasks still live, the runners' sessions, their
// warnings, their goroutines waiting on the database (those of runners in
// the test's process), the events of the conversations still live, the
// approvals lost and what Diagnose adds.
func (s *Scenario) WaitSettled() {
	s.T.Helper()
	deadline := time.Now().Add(SettleWithin)
	last, since, told := -1, time.Now(), false
	for !s.Done() {
		if time.Now().After(deadline) {
			warns, _, _ := s.logSummary()
			var log strings.Builder
			for _, msg := range slices.Sorted(maps.Keys(warns)) {
				fmt.Fprintf(&log, "%5d × %s\n", warns[msg], msg)
			}
			s.DumpTables()
			s.T.Logf("goroutines waiting on the database:\n%s", s.dumpGoroutines())
			var more string
			if s.Diagnose != nil {
				more = s.Diagnose()
			}
			s.T.Fatalf("lost work: tasks still live %s after the start:\n%s\nrunner sessions:\n%s\nrunner log:\n%s\n%s\nevents of the conversations still live:\n%s\n%s",
				time.Since(s.Began).Round(time.Second), s.dumpLive(200), s.dumpSessions(), log.String(), s.lostEmits(),
				strings.Join(s.Rows(`SELECT e.id, e.conversation_id, e.task_id, e.name, e.idempotency_key, e.emitted_at, e.delivered_to, e.delivered_at
					FROM {s}.events e WHERE e.conversation_id IN (SELECT conversation_id FROM {s}.tasks
						WHERE status IN ('pending','running','waiting','sleeping','completing'))
					ORDER BY e.id LIMIT 200`), "\n"),
				more)
		}
		// A workload that stops moving is worth a look while it stands
		// still: what is live, and what the runners' sessions wait for.
		if n := s.Runs(); n != last {
			last, since, told = n, time.Now(), false
		} else if !told && time.Since(since) > 5*time.Second {
			told = true
			s.T.Logf("no handler call for 5 s with tasks live:\n%s\nrunner sessions:\n%s", s.dumpLive(40), s.dumpSessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dumpLive describes the live tasks (the first limit) and their
// conversations' holders, and the wake jobs of the sleeping ones.
func (s *Scenario) dumpLive(limit int) string {
	return strings.Join(s.Rows(`SELECT t.id, t.conversation_id, t.kind, t.status, t.phase, t.attempt,
			coalesce(t.token, 0) AS token, coalesce(c.holder, '') AS holder, c.epoch, c.lease_expires_at
		FROM {s}.tasks t JOIN {s}.conversation_leases c ON c.id = t.conversation_id
		WHERE t.status IN ('pending','running','waiting','sleeping','completing') ORDER BY t.id LIMIT `+strconv.Itoa(limit)), "\n") +
		"\nwake jobs of sleeping tasks:\n" + strings.Join(s.Rows(`SELECT j.id, (j.args->>'task_id')::bigint AS task_id, j.state::text AS state,
			j.attempt, j.attempted_at, j.scheduled_at, j.attempted_by
		FROM {s}.river_job j JOIN {s}.tasks t ON t.id = (j.args->>'task_id')::bigint
		WHERE j.kind = 'arbor_wake' AND t.status = 'sleeping' ORDER BY j.id LIMIT 40`), "\n")
}

// dumpGoroutines writes every goroutine's stack of the test's process into
// the log folder and returns those of arbor's that wait inside pgx: where
// a run's end, a flush or a claim of a runner in this process is stuck on
// the database.
func (s *Scenario) dumpGoroutines() string {
	var all bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&all, 2)
	_ = os.WriteFile(filepath.Join(s.LogDir, "goroutines.txt"), all.Bytes(), 0o644)
	var out []string
	for _, g := range strings.Split(all.String(), "\n\n") {
		if strings.Contains(g, "jackc/pgx") && strings.Contains(g, "arborhq/arbor/") {
			out = append(out, g)
		}
	}
	return fmt.Sprintf("%d goroutines (all in %s):\n%s", len(out), filepath.Join(s.LogDir, "goroutines.txt"), strings.Join(out, "\n\n"))
}

// DumpTables writes the run log, the audit and the tasks as CSV files into
// the log folder, when the logs are kept (Config.KeepLogsEnv): the
// evidence to read after a failure, since the schema is dropped with the
// test.
func (s *Scenario) DumpTables() {
	if s.cfg.KeepLogsEnv == "" || os.Getenv(s.cfg.KeepLogsEnv) == "" {
		return
	}
	for _, table := range []string{"run_log", "side_effects", "chaos_faults", "chaos_audit", "tasks", "conversations", "events", "river_job"} {
		f, err := os.Create(filepath.Join(s.LogDir, table+".csv"))
		require.NoError(s.T, err)
		s.Retry("dump "+table, func(ctx context.Context) error {
			if err := f.Truncate(0); err != nil {
				return err
			}
			if _, err := f.Seek(0, 0); err != nil {
				return err
			}
			conn, err := s.Pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			_, err = conn.Conn().PgConn().CopyTo(ctx, f, s.Q(`COPY (SELECT * FROM {s}.`+table+` ORDER BY 1) TO STDOUT WITH CSV HEADER`))
			return err
		})
		require.NoError(s.T, f.Close())
	}
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
