package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// Scenario (j): what a budget reservation costs a handler, against a
// checkpoint, the handler's plainest write, measured the same way in the
// same run.

// budgetCounter is the counter of (j)'s budgets, and budgetMax their
// maximum: far above what any size spends, so that no reservation is
// refused and every one takes the common path.
const (
	budgetCounter       = "tokens"
	budgetMax     int64 = 1 << 50
)

// budgetReserve: N × Run.Reserve then Run.Record (two commits: the
// reservation against every budget above the task, then its close with
// the actual amount; one statement each on this, the common path),
// counted as one operation.
func budgetReserve(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return budgetOps(ctx, env, size, 60, func(ctx context.Context, run *machine.Run, i int) error {
		res, err := run.Reserve(ctx, budgetCounter, 100)
		if err != nil {
			return err
		}
		return run.Record(ctx, res, 60)
	})
}

// budgetSpend: N × Run.Spend (one commit, one statement: the reservation
// made and closed at once).
func budgetSpend(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return budgetOps(ctx, env, size, 60, func(ctx context.Context, run *machine.Run, i int) error {
		return run.Spend(ctx, budgetCounter, 60)
	})
}

// budgetCheckpoint: N × Run.Checkpoint with a small state, the baseline.
func budgetCheckpoint(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return budgetOps(ctx, env, size, 0, func(ctx context.Context, run *machine.Run, i int) error {
		return run.Checkpoint(ctx, "step", json.RawMessage(`{"step":`+strconv.Itoa(i)+`}`))
	})
}

// budgetOps runs one tree through a machine.Runner with RunnerConfig{}: a
// turn with a budget of its own and a conversation budget (both set by its
// Create), which spawns a sub-agent with a budget (SpawnParams.Budgets),
// which spawns a tool task without one: the tool's chain has three budgets
// above it — the sub-agent's, the turn's, the conversation's — and every
// reservation it makes is checked against and charged to all three. The
// tool's handler, once the tree stands, waits for the harness's signal,
// then does op N times one after the other; only those N calls are timed
// (by the handler's own clock) and counted (statements, commits, WAL:
// the counters' window opens before the signal and closes after the last
// call; the runner's idle polls in that window, about one statement a
// second, are counted with it). Then the tree completes, and each of the
// three budgets must show spent N × spentPerOp and nothing reserved.
func budgetOps(ctx context.Context, env *Env, size Size, spentPerOp int64,
	op func(ctx context.Context, run *machine.Run, i int) error) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	ready := make(chan struct{})
	start := make(chan struct{})
	type result struct {
		elapsed time.Duration
		err     error
	}
	measured := make(chan result, 1)
	done := make(chan struct{})
	limit := []arbortype.BudgetLimit{{Counter: budgetCounter, Max: budgetMax}}
	spawnAndWait := func(ctx context.Context, run *machine.Run, p machine.SpawnParams) error {
		kid, err := run.Spawn(ctx, p)
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled, Phase: phaseWaiting})
	}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == phaseWaiting {
				if err := run.Complete(ctx, nil); err != nil {
					return err
				}
				close(done)
				return nil
			}
			return spawnAndWait(ctx, run, machine.SpawnParams{Kind: "agent", Budgets: limit})
		},
		"agent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == phaseWaiting {
				return run.Complete(ctx, nil)
			}
			return spawnAndWait(ctx, run, machine.SpawnParams{Kind: "tool"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			close(ready)
			select {
			case <-start:
			case <-ctx.Done():
				return ctx.Err()
			}
			began := time.Now()
			for i := range size.N {
				if err := op(ctx, run, i); err != nil {
					measured <- result{err: fmt.Errorf("operation %d: %w", i, err)}
					return err
				}
			}
			measured <- result{elapsed: time.Since(began)}
			return run.Complete(ctx, nil)
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

	if _, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: "budget", Kind: "turn",
		Budgets: limit, ConversationBudgets: limit}); err != nil {
		return Measurement{}, err
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: the tool task never ran (%s): %w", errUnfinished, leftBehind(ctx, env), ctx.Err())
	}
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	close(start)
	var res result
	select {
	case res = <-measured:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: %w", errUnfinished, ctx.Err())
	}
	if res.err != nil {
		return Measurement{}, res.err
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: the turn did not complete (%s): %w", errUnfinished, leftBehind(ctx, env), ctx.Err())
	}
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, 3); err != nil {
		return Measurement{}, err
	}
	bs, err := eng.Budgets(ctx, "budget")
	if err != nil {
		return Measurement{}, fmt.Errorf("verify: %w", err)
	}
	if len(bs.Budgets) != 3 {
		return Measurement{}, fmt.Errorf("verify: %d budgets, want 3 (conversation, turn, sub-agent)", len(bs.Budgets))
	}
	for _, b := range bs.Budgets {
		if want := int64(size.N) * spentPerOp; b.Spent != want || b.Reserved != 0 {
			return Measurement{}, fmt.Errorf("verify: budget of task %d spent %d reserved %d, want %d and 0", b.TaskID, b.Spent, b.Reserved, want)
		}
	}
	m.Elapsed = res.elapsed
	m.Tasks = size.N
	return m, nil
}
