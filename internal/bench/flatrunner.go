package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
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
	nr, err := startNoopRunner(ctx, env, size.N)
	if err != nil {
		return Measurement{}, err
	}
	defer nr.stop()
	eng := nr.eng

	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	if batched {
		err = createNoops(ctx, env, eng, "flat", size.N, insertBatch(size.N, env.Conns))
	} else {
		err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
			_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("flat-%d", i), Kind: "noop"})
			return err
		})
	}
	if err != nil {
		return Measurement{}, fmt.Errorf("create: %w", err)
	}
	created := time.Now()
	select {
	case <-nr.done:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: %d of %d tasks completed (%s): %w", errUnfinished, nr.completed.Load(), size.N,
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

// noopRunner is a started machine.Runner with the zero RunnerConfig (only
// the logger and poll interval are the run's) on a pool of its own, whose
// "noop" handler completes its task and counts it; done is closed at the
// n-th.
type noopRunner struct {
	eng       *tasks.Engine
	completed atomic.Int64
	done      chan struct{}
	stop      func()
}

func startNoopRunner(ctx context.Context, env *Env, n int) (*noopRunner, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return nil, err
	}
	nr := &noopRunner{eng: eng, done: make(chan struct{})}
	handlers := map[string]machine.Handler{
		"noop": func(ctx context.Context, run *machine.Run) error {
			// The Complete the runner makes for a handler that returns nil,
			// made here so that its return can be counted.
			if err := run.Complete(ctx, nil); err != nil {
				return err
			}
			if nr.completed.Add(1) == int64(n) {
				close(nr.done)
			}
			return nil
		},
	}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	nr.stop = func() {
		stopRunner(ctx, env, r)
		pool.Close()
	}
	return nr, nil
}

// createNoops creates n root "noop" tasks, one conversation each (prefix-i),
// with Engine.CreateMany in batches of batch, on env.Conns goroutines.
func createNoops(ctx context.Context, env *Env, eng *tasks.Engine, prefix string, n, batch int) error {
	batches := splitBatches(n, batch)
	return parallel(ctx, env.Conns, len(batches), func(ctx context.Context, b int) error {
		ps := make([]arbortype.CreateParams, batches[b])
		for j := range ps {
			ps[j] = arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%d", prefix, b*batch+j), Kind: "noop"}
		}
		_, _, err := eng.CreateMany(ctx, ps)
		return err
	})
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
