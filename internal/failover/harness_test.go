package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
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

// scenario is the fault harness's scenario (internal/faultharness: a
// schema of its own with the run log, the side effects, the faults and the
// audit trigger, the test's engine and pool, the turns, the approvals, the
// proof) with what this suite adds: the cluster and the runners, in this
// process.
type scenario struct {
	*faultharness.Scenario
	cluster *cluster
	primary string // the data node that was primary at the start
	nodes   []*node

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
// standby), gives the test a scenario (faultharness.New) whose run log and
// side effects are on the outside database, and starts two runners. The
// tests do not run in parallel (no t.Parallel): each fails the cluster
// over.
//
// The workload's trees have awaits (an agent and a waiter: see
// internal/faultharness's workload), and the proof is held to what a
// failover must give (faultharness.Config.DatabaseFaultsOnly): no runner
// dies, so no restart may be counted.
func setup(t *testing.T, o options) *scenario {
	c := requireCluster(t)
	primary := c.healthy()
	s := &scenario{
		Scenario: faultharness.New(t, faultharness.Config{AppPrefix: appPrefix, Conversations: "fo", KeepLogsEnv: envKeepLogs,
			Awaits: true, DatabaseFaultsOnly: true}),
		cluster: c, primary: primary,
	}
	s.Diagnose = func() string { return "monitor events:\n" + c.events() }
	// The run log and the side effects, on the monitor's server.
	s.UseOutside(s.outsidePool("fo-test"))
	for _, name := range []string{"r1", "r2"} {
		s.startNode(name, o)
	}
	t.Logf("cluster: %s is the primary, %s its synchronous standby", primary, c.other(primary))
	return s
}

// node is a runner of the scenario: its own pools (arbor's, named
// appPrefix+name, and its run log's), engine and Runner, in this process.
type node struct {
	name   string
	pool   *pgxpool.Pool
	logs   *pgxpool.Pool
	runner *machine.Runner
	worker *faultharness.Worker
	log    string
	file   *os.File
	done   bool
}

func (s *scenario) startNode(name string, o options) *node {
	t := s.T
	t.Helper()
	n := &node{name: name, log: filepath.Join(s.LogDir, name+".log")}
	var err error
	n.file, err = os.Create(n.log)
	require.NoError(t, err)
	logger := slog.New(slog.NewJSONHandler(n.file, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n.pool = s.namedPool(appPrefix + name)
	n.logs = s.outsidePool(logPrefix + name)
	// The engine's defaults (UnavailableTimeout 30 s among them), as an
	// application's, but for the short leases above.
	engine, err := tasks.New(s.Ctx, n.pool, &tasks.Config{Schema: s.Schema, TaskLease: taskLease, IdleInTransaction: idleInTx, Logger: logger})
	require.NoError(t, err)
	n.worker = faultharness.NewWorker(n.logs, s.Schema, name, engine)
	n.runner, err = machine.NewRunner(engine, n.worker.Handlers(), &machine.RunnerConfig{
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
	require.NoError(t, n.runner.Start(s.Ctx))
	s.nodes = append(s.nodes, n)
	s.AddRunnerLog(name, n.log)
	t.Cleanup(func() { s.stopNode(n) })
	return n
}

// namedPool opens a pool on the cluster (ARBOR_DATABASE_URL: both data
// nodes, target_session_attrs=read-write) whose connections carry
// application_name app, closed when the test ends.
func (s *scenario) namedPool(app string) *pgxpool.Pool {
	s.T.Helper()
	return s.openPool(testdb.URL(s.T), app)
}

// envOutside names the database that stands for the outside world: on
// the monitor's server, which no fault touches (the cluster script
// exports it). The handlers' run log and side effects go there, so that
// a handler records its return at once, whatever the cluster does, and
// returns; the proof copies them into the scenario's schema
// (faultharness.Scenario.UseOutside).
const envOutside = "ARBOR_FAILOVER_OUTSIDE_URL"

func (s *scenario) outsidePool(app string) *pgxpool.Pool {
	s.T.Helper()
	url := os.Getenv(envOutside)
	require.NotEmpty(s.T, url, "%s is set by scripts/with-failover-cluster.sh", envOutside)
	return s.openPool(url, app)
}

// openPool opens a pool on url whose connections carry application_name
// app, closed when the test ends.
func (s *scenario) openPool(url, app string) *pgxpool.Pool {
	s.T.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(s.T, err)
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(s.Ctx, cfg)
	require.NoError(s.T, err)
	s.T.Cleanup(pool.Close)
	return pool
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
	// The record's statements still on their way land before the proof
	// reads it (each gives up after two minutes).
	n.worker.Wait()
	_ = n.file.Close()
	require.NoError(s.T, err, "runner %s stops cleanly", n.name)
}

func (s *scenario) stopAll() {
	for _, n := range s.nodes {
		s.stopNode(n)
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
	ctx, cancel := context.WithTimeout(s.Ctx, faultharness.SettleWithin)
	s.T.Cleanup(cancel)
	for _, id := range turns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for {
				_, err := s.Engine.AwaitSettled(ctx, id)
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
	case <-time.After(faultharness.WaitWithin):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	settled := map[int64]time.Time{}
	s.Retry("settled_at", func(ctx context.Context) error {
		rows, err := s.Pool.Query(ctx, s.Q(`SELECT id, settled_at FROM {s}.tasks WHERE id = ANY($1) AND settled_at IS NOT NULL`), f.turns)
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
