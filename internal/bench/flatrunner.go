package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// runnerIdleRelease is how long a machine of the flat scenario keeps a
// conversation with nothing left to run. The default (5 s) is meant for
// conversations whose next turn comes soon; here every conversation has one
// task, and with the default the runner's Capacity (1,000 conversations)
// would be spent holding finished ones, so the scenario would measure
// IdleRelease, not the runner.
const runnerIdleRelease = time.Millisecond

// flatRunner is scenario (a) through a real machine.Runner: the runner is
// started (not timed), then N root tasks are created on env.Conns
// goroutines, each a turn of a conversation of its own as in
// flatArborEngine, while the runner — env.Conns workers, River's wake
// client and timers running as in production — opens each conversation
// (lease + reconcile_on_open in one transaction), claims its task and runs
// the no-op handler, whose Complete is the one the runner would make when a
// handler returns nil. Timed from the first create to the last Complete.
func flatRunner(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatRunnerIn(ctx, env, size, size.N)
}

// flatRunnerShared is flatRunner with the N root tasks spread over
// env.Conns conversations (task i in conversation i mod env.Conns) and
// RunnerConfig.GenerationKinds set to a kind none of them has, so that they
// are not turns: every pending root of a held conversation is runnable at
// once, and one lease and reconcile_on_open serve many tasks.
func flatRunnerShared(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatRunnerIn(ctx, env, size, min(env.Conns, size.N))
}

func flatRunnerIn(ctx context.Context, env *Env, size Size, convs int) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var completed atomic.Int64
	done := make(chan struct{})
	handlers := map[string]machine.Handler{
		"noop": func(ctx context.Context, run *machine.Run) error {
			// As the runner's own Complete after a handler returns nil:
			// with a context the machine cannot cancel (see
			// completeUncancelled).
			if err := completeUncancelled(ctx, run); err != nil {
				return err
			}
			if completed.Add(1) == int64(size.N) {
				close(done)
			}
			return nil
		},
	}
	cfg := &machine.RunnerConfig{
		Workers:      env.Conns,
		IdleRelease:  runnerIdleRelease,
		PollInterval: env.RunnerPollInterval,
		Logger:       env.Logger,
	}
	if convs < size.N {
		cfg.GenerationKinds = []string{"turn"}
	}
	r, err := machine.NewRunner(eng, handlers, cfg)
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)

	// The runner's start is not timed, as River's migrations are not; its
	// statements and commits are counted from here.
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, tasks.CreateParams{ConversationID: fmt.Sprintf("flat-%d", i%convs), Kind: "noop"})
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create: %w", err)
	}
	created := time.Now()
	select {
	case <-done:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: %d of %d tasks completed (%s): %w", errUnfinished, completed.Load(), size.N,
			leftBehind(ctx, env), ctx.Err())
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.N); err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	m.Phases = map[string]time.Duration{"create (runner running)": created.Sub(start), "after last create": end.Sub(created)}
	return m, nil
}

// leftBehind describes the tasks that did not complete and their
// conversations' leases, for the error of a run that did not finish.
func leftBehind(ctx context.Context, env *Env) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var s string
	err := env.Pool.QueryRow(ctx, env.sql(`SELECT coalesce(string_agg(format('task %s %s %s attempt %s retries %s, conversation owner %s lease %s',
			t.id, t.kind, t.status, t.attempt, t.retries, c.holder, c.lease_expires_at - now()), '; '), 'none')
		FROM (SELECT * FROM {schema}.tasks WHERE status <> 'completed' ORDER BY id LIMIT 5) t
		JOIN {schema}.conversations c ON c.id = t.conversation_id`)).Scan(&s)
	if err != nil {
		return "left behind: " + err.Error()
	}
	return "left behind: " + s
}

// completeUncancelled completes run with a context the machine cannot
// cancel, as machine's execute does when a handler returns nil. With the
// handler's own context, the machine, seeing the task settled (its
// notification of the Complete's commit arrives before the COMMIT's reply
// is read), cancels that context and pgx reports "outcome unknown:
// connection lost during commit" for a Complete that did commit.
func completeUncancelled(ctx context.Context, run *machine.Run) error {
	return run.Complete(context.WithoutCancel(ctx), nil)
}

// stopRunner stops r, logging a failure (the figure is already taken).
func stopRunner(ctx context.Context, env *Env, r *machine.Runner) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		env.Logger.WarnContext(ctx, "bench: stopping the runner", "error", err.Error())
	}
}
