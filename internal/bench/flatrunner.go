package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// flatRunnerBatched is scenario (a) through a real machine.Runner with the
// zero RunnerConfig (every setting its default; only the logger is set):
// the runner is started (not timed, as River's client start is not), then
// N root tasks, each the turn of a conversation of its own, are created
// with Engine.CreateMany in batches — as River's jobs are inserted with
// InsertMany, in batches of the same size — on env.Conns goroutines, while
// the runner opens their conversations (lease, reconcile_on_open and the
// claim of their work in one transaction for many), runs the no-op handler
// and completes each task through its batching completer. Timed from the
// first create to the last completion.
func flatRunnerBatched(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatRunnerIn(ctx, env, size, true)
}

// flatRunnerCreates is flatRunnerBatched with one Engine.Create per task,
// each its own transaction, as a chat backend creates a turn per message.
func flatRunnerCreates(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatRunnerIn(ctx, env, size, false)
}

func flatRunnerIn(ctx context.Context, env *Env, size Size, batched bool) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var completed atomic.Int64
	done := make(chan struct{})
	handlers := map[string]machine.Handler{
		"noop": func(ctx context.Context, run *machine.Run) error {
			// The Complete the runner makes for a handler that returns nil,
			// made here so that its return can be counted.
			if err := run.Complete(ctx, nil); err != nil {
				return err
			}
			if completed.Add(1) == int64(size.N) {
				close(done)
			}
			return nil
		},
	}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)

	params := func(i int) tasks.CreateParams {
		return tasks.CreateParams{ConversationID: fmt.Sprintf("flat-%d", i), Kind: "noop"}
	}
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	if batched {
		batch := insertBatch(size.N, env.Conns)
		batches := splitBatches(size.N, batch)
		err = parallel(ctx, env.Conns, len(batches), func(ctx context.Context, b int) error {
			ps := make([]tasks.CreateParams, batches[b])
			for j := range ps {
				ps[j] = params(b*batch + j)
			}
			_, _, err := eng.CreateMany(ctx, ps)
			return err
		})
	} else {
		err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
			_, _, err := eng.Create(ctx, params(i))
			return err
		})
	}
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
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed' AND conversation_id LIKE 'flat-%'`, size.N); err != nil {
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
			t.id, t.kind, t.status, t.attempt, t.retries, c.holder, h.expires_at - now()), '; '), 'none')
		FROM (SELECT * FROM {schema}.tasks WHERE status <> 'completed' ORDER BY id LIMIT 5) t
		JOIN {schema}.conversations c ON c.id = t.conversation_id
		LEFT JOIN {schema}.holders h ON h.id = c.holder_id`)).Scan(&s)
	if err != nil {
		return "left behind: " + err.Error()
	}
	return "left behind: " + s
}

// stopRunner stops r, logging a failure (the figure is already taken).
func stopRunner(ctx context.Context, env *Env, r *machine.Runner) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		env.Logger.WarnContext(ctx, "bench: stopping the runner", "error", err.Error())
	}
}
