package arbortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// turn spawns a search and waits on it; woken, it answers with the
// search's result.
func turn(ctx context.Context, run *machine.Run) error {
	if run.Task.Phase == "answer" {
		kids, err := run.Waited(ctx)
		if err != nil {
			return err
		}
		return run.Complete(ctx, json.RawMessage(`{"answer": `+string(kids[0].Result)+`}`))
	}
	kid, err := run.Spawn(ctx, machine.SpawnParams{Kind: "search", Input: json.RawMessage(`"weather"`)})
	if err != nil {
		return err
	}
	return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled, Phase: "answer"})
}

func search(ctx context.Context, run *machine.Run) error {
	return run.Complete(ctx, json.RawMessage(`"sunny"`))
}

// A turn worked step by step: it spawns its tool call and waits; the tool
// call completes, which wakes the turn in the same transaction; the turn
// answers. Each step is the real engine's writes.
func TestWorkTurnWithToolCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(t, arbortype.CreateParams{Kind: "turn"})

	res := arbortest.Work(b.ctx, t, b.engine, turn, id)
	require.Equal(t, arbortest.WorkWaiting, res.Outcome)
	require.False(t, res.Woken)
	require.NoError(t, res.Err)
	require.Equal(t, arbortype.StatusWaiting, res.Task.Status)
	require.Len(t, res.Spawned, 1)
	require.Equal(t, "search", res.Spawned[0].Kind)
	require.Equal(t, arbortype.StatusPending, res.Spawned[0].Status, "Work starts only the task it is given")
	kids := arbortest.RequireChildren(b.ctx, t, b.engine, id, "search", 1)
	require.Equal(t, res.Spawned[0].ID, kids[0].ID)

	res = arbortest.Work(b.ctx, t, b.engine, search, kids[0].ID)
	require.Equal(t, arbortest.WorkCompleted, res.Outcome)
	require.Empty(t, res.Spawned)
	arbortest.RequireSettled(b.ctx, t, b.engine, kids[0].ID, arbortype.StatusCompleted, json.RawMessage(`"sunny"`))
	woken := arbortest.RequireStatus(b.ctx, t, b.engine, id, arbortype.StatusPending)
	require.Equal(t, "answer", woken.Phase, "the settle woke the turn into its wait's phase")

	res = arbortest.Work(b.ctx, t, b.engine, turn, id)
	require.Equal(t, arbortest.WorkCompleted, res.Outcome)
	require.Empty(t, res.Spawned, "the second run spawns nothing")
	arbortest.RequireSettled(b.ctx, t, b.engine, id, arbortype.StatusCompleted, json.RawMessage(`{ "answer" : "sunny" }`))
	arbortest.RequireConsistent(b.ctx, t, b.engine, b.conv)

	// The lease was given back: the conversation is free for a Runner.
	l, err := machine.AcquireLease(b.ctx, b.engine, b.conv, nil)
	require.NoError(t, err)
	require.Empty(t, l.Report().Requeued, "Work left nothing running")
	require.NoError(t, l.Release(b.ctx))
}

// A Worker picks each task's handler by its kind.
func TestWorkerByKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := arbortest.NewWorker(t, b.engine, map[string]machine.Handler{"turn": turn, "search": search})
	id := b.create(t, arbortype.CreateParams{Kind: "turn"})
	res := w.Work(b.ctx, t, id)
	require.Equal(t, arbortest.WorkWaiting, res.Outcome)
	require.Equal(t, arbortest.WorkCompleted, w.Work(b.ctx, t, res.Spawned[0].ID).Outcome)
	require.Equal(t, arbortest.WorkCompleted, w.Work(b.ctx, t, id).Outcome)
	arbortest.RequireSettled(b.ctx, t, b.engine, id, arbortype.StatusCompleted, json.RawMessage(`{"answer": "sunny"}`))

	other := b.create(t, arbortype.CreateParams{Kind: "unknown"})
	f := &fakeTB{TB: t}
	require.Nil(t, w.Work(b.ctx, f, other))
	f.requireFailed(t, `kind "unknown"`, "no handler")
	arbortest.RequireStatus(b.ctx, t, b.engine, other, arbortype.StatusPending)
}

// Every way a run ends is reported, with the task as it was left.
func TestWorkOutcomes(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		params  arbortype.CreateParams
		handler machine.Handler
		outcome arbortest.WorkOutcome
		status  arbortype.Status
		woken   bool
		err     error
		check   func(t *testing.T, b *bundle, res *arbortest.WorkResult)
	}{
		{
			name:    "nil completes with no result",
			handler: func(context.Context, *machine.Run) error { return nil },
			outcome: arbortest.WorkCompleted, status: arbortype.StatusCompleted,
			check: func(t *testing.T, b *bundle, res *arbortest.WorkResult) {
				arbortest.RequireSettled(b.ctx, t, b.engine, res.Task.ID, arbortype.StatusCompleted, json.RawMessage(`null`))
			},
		},
		{
			name:    "an error with retries left is retried",
			params:  arbortype.CreateParams{MaxRetries: 2},
			handler: func(context.Context, *machine.Run) error { return boom },
			outcome: arbortest.WorkRetried, status: arbortype.StatusSleeping, err: boom,
			check: func(t *testing.T, _ *bundle, res *arbortest.WorkResult) {
				require.Equal(t, 1, res.Task.Retries)
				require.Equal(t, "boom", res.Task.Error.Message)
			},
		},
		{
			name:    "a non-retryable error fails at once",
			params:  arbortype.CreateParams{MaxRetries: 2},
			handler: func(context.Context, *machine.Run) error { return machine.NonRetryable(boom) },
			outcome: arbortest.WorkFailed, status: arbortype.StatusFailed, err: boom,
		},
		{
			name:    "a panic fails with its code",
			handler: func(context.Context, *machine.Run) error { panic("kaboom") },
			outcome: arbortest.WorkFailed, status: arbortype.StatusFailed,
			check: func(t *testing.T, _ *bundle, res *arbortest.WorkResult) {
				require.ErrorContains(t, res.Err, "kaboom")
				require.Equal(t, "panic", res.Task.Error.Code)
			},
		},
		{
			name: "a sleep",
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.SleepUntil(ctx, time.Now().Add(time.Hour), "later", json.RawMessage(`{"n": 1}`))
			},
			outcome: arbortest.WorkSleeping, status: arbortype.StatusSleeping,
			check: func(t *testing.T, _ *bundle, res *arbortest.WorkResult) {
				require.Equal(t, "later", res.Task.Phase)
				require.NotNil(t, res.Task.WakeAt)
			},
		},
		{
			name: "an await",
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Phase: "approved"})
			},
			outcome: arbortest.WorkAwaiting, status: arbortype.StatusSleeping,
			check: func(t *testing.T, b *bundle, res *arbortest.WorkResult) {
				p := arbortest.RequirePendingEvent(b.ctx, t, b.engine, res.Task.ID, "approval")
				require.NotEmpty(t, p.Token)
			},
		},
		{
			name: "a wait satisfied at once wakes the task",
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.Wait(ctx, machine.WaitParams{Policy: arbortype.AllSettled, Phase: "next"})
			},
			outcome: arbortest.WorkWaiting, status: arbortype.StatusPending, woken: true,
		},
		{
			name: "complete with a live child is completing",
			handler: func(ctx context.Context, run *machine.Run) error {
				if _, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"}); err != nil {
					return err
				}
				return run.Complete(ctx, json.RawMessage(`1`))
			},
			outcome: arbortest.WorkCompleted, status: arbortype.StatusCompleting,
			check: func(t *testing.T, b *bundle, res *arbortest.WorkResult) {
				require.Len(t, res.Spawned, 1)
				arbortest.RequireChildren(b.ctx, t, b.engine, res.Task.ID, "tool", 1)
			},
		},
		{
			name: "a refused wait fails the run, as a Runner does",
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{run.Task.ID}, Policy: arbortype.AllSettled})
			},
			outcome: arbortest.WorkFailed, status: arbortype.StatusFailed,
			check: func(t *testing.T, _ *bundle, res *arbortest.WorkResult) {
				require.ErrorContains(t, res.Err, "not a child")
				require.Contains(t, res.Task.Error.Message, "not a child")
			},
		},
		{
			name:   "a budget that fails fails the task",
			params: arbortype.CreateParams{MaxRetries: 2, Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 10}}},
			handler: func(ctx context.Context, run *machine.Run) error {
				_, err := run.Reserve(ctx, "tokens", 11)
				return err
			},
			outcome: arbortest.WorkFailed, status: arbortype.StatusFailed, err: arbortype.ErrBudgetExhausted,
			check: func(t *testing.T, _ *bundle, res *arbortest.WorkResult) {
				require.Equal(t, arbortype.CodeBudgetExhausted, res.Task.Error.Code, "not retried, whatever its retries")
				require.Zero(t, res.Task.Retries)
			},
		},
		{
			name: "a budget that parks awaits its raise",
			params: arbortype.CreateParams{Budgets: []arbortype.BudgetLimit{
				{Counter: "tokens", Max: 10, OnExhausted: arbortype.BudgetPark}}},
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.Spend(ctx, "tokens", 11)
			},
			outcome: arbortest.WorkAwaiting, status: arbortype.StatusSleeping, err: arbortype.ErrBudgetExhausted,
			check: func(t *testing.T, b *bundle, res *arbortest.WorkResult) {
				arbortest.RequirePendingEvent(b.ctx, t, b.engine, res.Task.ID, arbortype.BudgetEvent)
			},
		},
		{
			name: "a task aborted under its run is stopped",
			handler: func(ctx context.Context, run *machine.Run) error {
				return run.Complete(ctx, nil)
			},
			outcome: arbortest.WorkStopped, status: arbortype.StatusAborted, err: arbortype.ErrAborted,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tc.params.Kind = "task"
			id := b.create(t, tc.params)
			h := tc.handler
			if tc.outcome == arbortest.WorkStopped {
				h = func(ctx context.Context, run *machine.Run) error {
					if _, err := b.engine.Abort(ctx, run.Task.ID); err != nil {
						return err
					}
					return tc.handler(ctx, run)
				}
			}
			res := arbortest.Work(b.ctx, t, b.engine, h, id)
			require.Equal(t, tc.outcome, res.Outcome)
			require.Equal(t, tc.status, res.Task.Status)
			require.Equal(t, tc.woken, res.Woken)
			if tc.err != nil {
				require.ErrorIs(t, res.Err, tc.err)
			}
			if tc.check != nil {
				tc.check(t, b, res)
			}
			arbortest.RequireConsistent(b.ctx, t, b.engine, b.conv)
		})
	}
}

// An event emitted before the await is not lost: the await takes it, and
// the task is pending again with what was delivered.
func TestWorkAwaitTakesEarlierEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(t, arbortype.CreateParams{Kind: "ask"})
	_, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approval", Payload: json.RawMessage(`"yes"`)})
	require.NoError(t, err)
	ask := func(ctx context.Context, run *machine.Run) error {
		if run.Task.Phase == "decided" {
			return run.Complete(ctx, run.Task.Delivered.Payload)
		}
		return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Phase: "decided"})
	}
	res := arbortest.Work(b.ctx, t, b.engine, ask, id)
	require.Equal(t, arbortest.WorkAwaiting, res.Outcome)
	require.True(t, res.Woken)
	require.Equal(t, arbortype.StatusPending, res.Task.Status)
	require.Equal(t, arbortest.WorkCompleted, arbortest.Work(b.ctx, t, b.engine, ask, id).Outcome)
	arbortest.RequireSettled(b.ctx, t, b.engine, id, arbortype.StatusCompleted, json.RawMessage(`"yes"`))
}

// CompleteTx lands with the caller's transaction; one that does not commit
// fails the run, as a Runner does.
func TestWorkCompleteTx(t *testing.T) {
	t.Parallel()
	pool := testdbPool(t)
	engine := arbortest.Engine(t, pool, nil)
	ctx := t.Context()
	for _, commit := range []bool{true, false} {
		task, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-tx", Kind: "turn", MaxRetries: 1})
		require.NoError(t, err)
		res := arbortest.Work(ctx, t, engine, func(ctx context.Context, run *machine.Run) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := run.CompleteTx(ctx, tx, json.RawMessage(`"saved"`)); err != nil {
				return err
			}
			if !commit {
				return nil
			}
			return tx.Commit(ctx)
		}, task.ID)
		if commit {
			require.Equal(t, arbortest.WorkCompleted, res.Outcome)
			arbortest.RequireSettled(ctx, t, engine, task.ID, arbortype.StatusCompleted, json.RawMessage(`"saved"`))
			continue
		}
		require.Equal(t, arbortest.WorkRetried, res.Outcome)
		require.Equal(t, arbortype.CodeEndingNotCommitted, res.Task.Error.Code)
	}
}
