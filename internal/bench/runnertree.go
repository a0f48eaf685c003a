package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// fanoutRunner is scenario (b), and the agent shape (h), through a real
// machine.Runner with the zero RunnerConfig: P parents, each the turn of a
// conversation of its own, created on env.Conns goroutines with one
// Engine.Create each (a turn per message). A parent's handler spawns its C
// children at once (Run.SpawnMany, one statement) and waits on them
// (all_settled); each child's handler completes; the last child's settle
// wakes the parent in the completer's flush, which claims it again in the
// same transaction; the parent's handler, run again in its waiting phase,
// completes. Timed from the first create to the last parent's completion.
func fanoutRunner(ctx context.Context, env *Env, size Size) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var parents atomic.Int64
	done := make(chan struct{})
	handlers := map[string]machine.Handler{
		"parent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == phaseWaiting {
				if err := run.Complete(ctx, nil); err != nil {
					return err
				}
				if parents.Add(1) == int64(size.P) {
					close(done)
				}
				return nil
			}
			ps := make([]machine.SpawnParams, size.C)
			for i := range ps {
				ps[i] = machine.SpawnParams{Kind: "child"}
			}
			kids, err := run.SpawnMany(ctx, ps)
			if err != nil {
				return err
			}
			ids := make([]int64, len(kids))
			for i, k := range kids {
				ids[i] = k.ID
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: phaseWaiting})
		},
		"child": func(ctx context.Context, run *machine.Run) error { return nil },
	}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)

	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.P, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("fan-%d", i), Kind: "parent"})
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create parents: %w", err)
	}
	created := time.Now()
	select {
	case <-done:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: %d of %d parents completed (%s): %w", errUnfinished, parents.Load(), size.P,
			leftBehind(ctx, env), ctx.Err())
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.Tasks); err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	m.Phases = map[string]time.Duration{"create parents (runner running)": created.Sub(start), "after last create": end.Sub(created)}
	return m, nil
}
