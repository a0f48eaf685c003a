package machine_test

import (
	"context"
	"encoding/json"
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
	return &machine.RunnerConfig{
		NodeID:            node,
		Workers:           32,
		ConversationLease: time.Second,
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
//   - step works StepMS, heartbeating, then completes;
//   - once and slow work two seconds (so a crash catches them running);
//   - block waits for its context to end and records when it did.
func workHandlers(pool *pgxpool.Pool, schema, node string) map[string]machine.Handler {
	logStart := func(ctx context.Context, run *machine.Run) (int64, error) {
		var id int64
		err := pool.QueryRow(context.WithoutCancel(ctx), `INSERT INTO `+schema+`.run_log (task_id, token, node, kind, attempt)
			VALUES ($1, $2, $3, $4, $5) RETURNING id`, run.Task.ID, run.Task.Token, node, run.Task.Kind, run.Task.Attempt).Scan(&id)
		return id, err
	}
	logEnd := func(ctx context.Context, id int64, column string) error {
		_, err := pool.Exec(context.WithoutCancel(ctx), `UPDATE `+schema+`.run_log SET `+column+` = clock_timestamp() WHERE id = $1`, id)
		return err
	}
	work := func(ctx context.Context, run *machine.Run, d time.Duration) error {
		id, err := logStart(ctx, run)
		if err != nil {
			return err
		}
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				_ = logEnd(ctx, id, "cancelled_at")
				return context.Cause(ctx)
			case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
			}
			if err := run.Heartbeat(ctx); err != nil {
				_ = logEnd(ctx, id, "cancelled_at")
				return err
			}
		}
		if err := logEnd(ctx, id, "ended_at"); err != nil {
			return err
		}
		return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"by": %q}`, node)))
	}
	return map[string]machine.Handler{
		"root": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				return run.Complete(ctx, json.RawMessage(`"done"`))
			}
			var in workInput
			if err := json.Unmarshal(run.Task.Input, &in); err != nil {
				return fmt.Errorf("%w: %v", machine.ErrNonRetryable, err)
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
				if err := spawn(machine.SpawnParams{Kind: "slow", RestartLimit: tasks.RestartLimitNone}, "slow"); err != nil {
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
			id, err := logStart(ctx, run)
			if err != nil {
				return err
			}
			<-ctx.Done()
			_ = logEnd(ctx, id, "cancelled_at")
			return context.Cause(ctx)
		},
	}
}

const runLogDDL = `CREATE TABLE %s.run_log (
	id           bigserial PRIMARY KEY,
	task_id      bigint NOT NULL,
	token        bigint NOT NULL,
	node         text NOT NULL,
	kind         text NOT NULL,
	attempt      integer NOT NULL,
	started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
	ended_at     timestamptz,
	cancelled_at timestamptz)`
