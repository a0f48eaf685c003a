package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// The test binary doubles as a runner process: re-executed with
// ARBOR_CHILD_RUNNER set, it runs a Runner with the handlers below against
// the schema it is given until it is killed, told to stop (SIGTERM), or a
// minute and a half passes.
func TestMain(m *testing.M) {
	if os.Getenv("ARBOR_CHILD_RUNNER") != "" {
		os.Exit(runChild())
	}
	os.Exit(testdb.Main(m))
}

func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	schema, node := os.Getenv("ARBOR_CHILD_SCHEMA"), os.Getenv("ARBOR_CHILD_NODE")
	pool, err := pgxpool.New(ctx, os.Getenv(testdb.EnvURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TaskLease: time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	runner, err := machine.NewRunner(engine, workHandlers(pool, schema, node), childRunnerConfig(node))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := runner.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("runner started", node)
	<-ctx.Done()
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer stopCancel()
	if err := runner.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func childRunnerConfig(node string) *machine.RunnerConfig {
	lease := time.Second
	if d, err := time.ParseDuration(os.Getenv("ARBOR_CHILD_LEASE")); err == nil {
		lease = d
	}
	return &machine.RunnerConfig{
		LifeDir:           os.Getenv("ARBOR_CHILD_LIFEDIR"),
		NodeID:            node,
		Workers:           32,
		ConversationLease: lease,
		PollInterval:      50 * time.Millisecond,
		IdleRelease:       300 * time.Millisecond,
		ShutdownGrace:     5 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true},
	}
}

// workInput is the input of the work handlers' root tasks.
type workInput struct {
	Steps  int  `json:"steps"`
	StepMS int  `json:"step_ms"`
	Once   bool `json:"once"`
	Slow   bool `json:"slow"`
}

// workHandlers record every run in <schema>.run_log (created by the test):
//   - root spawns Steps children of kind step (and a once child with
//     abandon_on_restart, and a slow child with no restart allowed), waits
//     on them (all_settled), then completes;
//   - step works StepMS, heartbeating, then completes with its node and
//     its row of the run log as its result;
//   - once and slow work two seconds (so a crash catches them running);
//   - block waits for its context to end and records when it did.
func workHandlers(pool *pgxpool.Pool, schema, node string) map[string]machine.Handler {
	logStart := func(ctx context.Context, run *machine.Run) (*loggedRun, error) {
		r := &loggedRun{pool: pool, schema: schema, live: time.Now()}
		err := pool.QueryRow(context.WithoutCancel(ctx), `INSERT INTO `+schema+`.run_log (task_id, token, node, kind, attempt, started_at)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, run.Task.ID, run.Task.Token, node, run.Task.Kind, run.Task.Attempt, r.live).Scan(&r.id)
		return r, err
	}
	work := func(ctx context.Context, run *machine.Run, d time.Duration) error {
		r, err := logStart(ctx, run)
		if err != nil {
			return err
		}
		deadline := r.live.Add(d)
		for r.alive(ctx) && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				continue
			case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
			}
			if err := run.Heartbeat(ctx); err != nil {
				return r.end(ctx, "cancelled_at", err)
			}
		}
		if ctx.Err() != nil {
			return r.end(ctx, "cancelled_at", context.Cause(ctx))
		}
		if _, err := pool.Exec(context.WithoutCancel(ctx), `UPDATE `+schema+`.run_log SET ended_at = clock_timestamp() WHERE id = $1`, r.id); err != nil {
			return err
		}
		return r.end(ctx, "", run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"by": %q, "run": %d}`, node, r.id))))
	}
	return map[string]machine.Handler{
		"root": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				return run.Complete(ctx, json.RawMessage(`"done"`))
			}
			var in workInput
			if err := json.Unmarshal(run.Task.Input, &in); err != nil {
				return fmt.Errorf("%w: %v", arbortype.ErrNonRetryable, err)
			}
			var ids []int64
			spawn := func(p machine.SpawnParams, key string) error {
				p.IdempotencyKey = fmt.Sprintf("%d/%s", run.Task.ID, key)
				c, err := run.Spawn(ctx, p)
				ids = append(ids, c.ID)
				return err
			}
			stepInput := json.RawMessage(fmt.Sprintf(`{"step_ms": %d}`, in.StepMS))
			for i := range in.Steps {
				if err := spawn(machine.SpawnParams{Kind: "step", Input: stepInput}, fmt.Sprint("step", i)); err != nil {
					return err
				}
			}
			if in.Once {
				if err := spawn(machine.SpawnParams{Kind: "once", AbandonOnRestart: true}, "once"); err != nil {
					return err
				}
			}
			if in.Slow {
				if err := spawn(machine.SpawnParams{Kind: "slow", RestartLimit: arbortype.RestartLimitNone}, "slow"); err != nil {
					return err
				}
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "gathering"})
		},
		"step": func(ctx context.Context, run *machine.Run) error {
			var in workInput
			_ = json.Unmarshal(run.Task.Input, &in)
			return work(ctx, run, time.Duration(in.StepMS)*time.Millisecond)
		},
		"once": func(ctx context.Context, run *machine.Run) error { return work(ctx, run, 2*time.Second) },
		"slow": func(ctx context.Context, run *machine.Run) error { return work(ctx, run, 2*time.Second) },
		"block": func(ctx context.Context, run *machine.Run) error {
			r, err := logStart(ctx, run)
			if err != nil {
				return err
			}
			<-ctx.Done()
			return r.end(ctx, "cancelled_at", context.Cause(ctx))
		},
	}
}

// loggedRun is a handler run's row in the run log.
type loggedRun struct {
	pool   *pgxpool.Pool
	schema string
	id     int64
	// live is the last moment the run found its context live (at first,
	// the handler's entry).
	live time.Time
}

// alive reports whether ctx is live, and if so moves r.live to a moment
// read before ctx.Err(): Err also checks the node's lease against the
// clock, so the run surely held its lease then.
func (r *loggedRun) alive(ctx context.Context) bool {
	now := time.Now()
	if ctx.Err() != nil {
		return false
	}
	r.live = now
	return true
}

// end records how the run ended, as the handler's last act — column
// (cancelled_at: the run was cut) stamped, how long it was live, when it
// returned, and its outcome: "completed" when err is nil (its Complete
// returned nil), else err, and whether err says that the run lost its
// lease (arbortype.ErrLeaseLost) — and returns err. A Complete that returned
// the run stopped (its context cancelled while the write was in flight)
// may still have landed: the task's result says which run completed it.
func (r *loggedRun) end(ctx context.Context, column string, err error) error {
	set := ""
	if column != "" {
		set = column + " = clock_timestamp(), "
	}
	outcome := "completed"
	if err != nil {
		outcome = err.Error()
	}
	_, logErr := r.pool.Exec(context.WithoutCancel(ctx), `UPDATE `+r.schema+`.run_log SET `+set+`live_until = $2, returned_at = $3, outcome = $4, lease_lost = $5 WHERE id = $1`,
		r.id, r.live, time.Now(), outcome, leaseLost(ctx, err))
	if err == nil {
		return logErr
	}
	return err
}

// leaseLost reports whether err says that the run lost its lease: it is
// ErrLeaseLost, or ErrAmbiguous for a write that was in flight when the
// run was stopped because its lease was lost (the fence fired meanwhile:
// the write may or may not have landed, and the task's result says which).
func leaseLost(ctx context.Context, err error) bool {
	return errors.Is(err, arbortype.ErrLeaseLost) ||
		errors.Is(err, arbortype.ErrAmbiguous) && errors.Is(context.Cause(ctx), arbortype.ErrLeaseLost)
}

// runLogDDL is the run log: a row per handler run of the work handlers.
// started_at, live_until and returned_at are the handler's clock (every
// process of a test runs on one machine): its entry, the last moment it
// found its context live, and its last act, just before it returned.
// ended_at (its work done) and cancelled_at (cut) are the database's
// clock when they were recorded. outcome is "completed" when the run's
// Complete returned nil, else the error that ended it (lease_lost: one
// that says the run lost its lease); null where the process died first.
const runLogDDL = `CREATE TABLE %s.run_log (
	id           bigserial PRIMARY KEY,
	task_id      bigint NOT NULL,
	token        bigint NOT NULL,
	node         text NOT NULL,
	kind         text NOT NULL,
	attempt      integer NOT NULL,
	started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
	ended_at     timestamptz,
	cancelled_at timestamptz,
	live_until   timestamptz,
	returned_at  timestamptz,
	outcome      text,
	lease_lost   boolean)`
