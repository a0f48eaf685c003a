package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// budgetOf returns the budget of counter on scope (0: the conversation).
func (b *bundle) budgetOf(t *testing.T, scope int64, counter string) arbortype.Budget {
	t.Helper()
	got, err := b.engine.Budget(b.ctx, b.conv, scope, counter)
	require.NoError(t, err)
	return got
}

// Engine.Budget reads one budget as Budgets lists it; a budget that is not
// set, of a conversation or task that has it not, is ErrNotFound.
func TestBudgetReadsOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets:             []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}},
		ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000, OnExhausted: arbortype.BudgetPark}}})
	require.NoError(t, err)
	all, err := b.engine.Budgets(b.ctx, b.conv)
	require.NoError(t, err)
	require.Len(t, all.Budgets, 2)
	for _, want := range all.Budgets {
		got, err := b.engine.Budget(b.ctx, b.conv, want.TaskID, want.Counter)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	require.Equal(t, int64(100), b.budgetOf(t, task.ID, "tokens").Max)
	require.Equal(t, arbortype.BudgetPark, b.budgetOf(t, 0, "tokens").OnExhausted)
	for _, c := range []struct {
		conv    string
		task    int64
		counter string
		says    string
	}{
		{b.conv, 0, "tool_calls", "none is set"},
		{b.conv, task.ID + 1, "tokens", "none is set"},
		{b.conv + "-none", 0, "tokens", "no such conversation"},
	} {
		_, err := b.engine.Budget(b.ctx, c.conv, c.task, c.counter)
		require.ErrorIs(t, err, arbortype.ErrNotFound, "%+v", c)
		require.ErrorContains(t, err, c.says)
	}
}

// budgetRows counts what budgets write, for "nothing was written".
func (b *bundle) budgetRows(t *testing.T) string {
	t.Helper()
	var out string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
		(SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.counter, x.task_id), '[]') FROM `+b.schema+`.budgets x)::text ||
		(SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.id), '[]') FROM `+b.schema+`.budget_reservations r)::text`).Scan(&out))
	return out
}

// A turn's budget is shared by 50 sub-agents reserving at once: the
// reservations that succeed never add up to more than the budget, the
// refusals name it, and every budget equals its reservations (invariant
// 10) at the end.
func TestSiblingsNeverOverspend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets:             []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000, OnExhausted: arbortype.BudgetReturn}},
		ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: arbortype.Unlimited}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	turnRun, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	specs := make([]machine.SpawnParams, 50)
	for i := range specs {
		specs[i] = machine.SpawnParams{Kind: "agent"}
	}
	agents, err := turnRun.SpawnMany(b.ctx, specs)
	require.NoError(t, err)
	runs := make([]*machine.Run, len(agents))
	for i, a := range agents {
		runs[i], err = lease.Start(b.ctx, a.ID)
		require.NoError(t, err)
	}

	// The database's own sums are checked after every grant: what the
	// turn's budget holds (spent and reserved) never exceeds its maximum.
	// (No require in these goroutines: a failure must not stop one of them
	// holding anything the others wait for.)
	held := func() (int64, error) {
		var n int64
		err := b.pool.QueryRow(b.ctx, `SELECT spent + reserved FROM `+b.schema+`.budgets
			WHERE conversation_id = $1 AND task_id = $2 AND counter = 'tokens'`, b.conv, turn.ID).Scan(&n)
		return n, err
	}
	var (
		refusals atomic.Int64
		wg       sync.WaitGroup
		start    = make(chan struct{})
	)
	for i, run := range runs {
		wg.Go(func() {
			<-start
			for {
				res, err := run.Reserve(b.ctx, "tokens", 30)
				var over *arbortype.BudgetExhaustedError
				if errors.As(err, &over) {
					refusals.Add(1)
					assert.Equal(t, turn.ID, over.Budget.TaskID, "the turn's budget is the one that refuses")
					assert.False(t, over.Ended, "a budget that returns leaves the run going")
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				n, err := held()
				if !assert.NoError(t, err) || !assert.LessOrEqual(t, n, int64(1000), "reservations granted beyond the budget") {
					return
				}
				// Half the agents record less than they reserved: the rest
				// is released for the others.
				used := int64(30)
				if i%2 == 0 {
					used = 20
				}
				if !assert.NoError(t, run.Record(b.ctx, res, used)) {
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, int64(len(runs)), refusals.Load())
	got := b.budgetOf(t, turn.ID, "tokens")
	require.Zero(t, got.Reserved)
	require.LessOrEqual(t, got.Spent, int64(1000))
	require.Greater(t, got.Spent, int64(1000-30), "the budget was used up to what a reservation needs")
	require.Equal(t, got.Spent, b.budgetOf(t, 0, "tokens").Spent, "the conversation's tally counts the same spend")
	b.requireClean(t)
}

// A crash between reserve and record neither loses the reservation nor
// counts it twice: the crashed run's reservation is spent in full (an upper
// bound of what its call cost) when the next run reserves, exactly once,
// and the crashed run's late record is refused.
func TestCrashBetweenReserveAndRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	first, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	lost, err := first.Reserve(b.ctx, "tokens", 100)
	require.NoError(t, err)
	require.Equal(t, int64(100), b.budgetOf(t, task.ID, "tokens").Reserved)
	// The crash: the lease is given up with the run in flight; the task is
	// requeued (a release counts no restart), the run's token dead.
	require.NoError(t, lease.Release(b.ctx))
	require.Equal(t, int64(100), b.budgetOf(t, task.ID, "tokens").Reserved, "held until someone sweeps it")
	b.requireClean(t)

	lease, err = machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	second, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, 0, second.Task.Attempt)
	require.NotEqual(t, first.Task.Token, second.Task.Token)
	res, err := second.Reserve(b.ctx, "tokens", 50)
	require.NoError(t, err)
	got := b.budgetOf(t, task.ID, "tokens")
	require.Equal(t, int64(100), got.Spent, "the crashed run's reservation, spent in full")
	require.Equal(t, int64(50), got.Reserved)
	require.ErrorIs(t, first.Record(b.ctx, lost, 10), arbortype.ErrNotRunning, "spent in full already: not counted again")
	require.NoError(t, second.Record(b.ctx, res, 20))
	require.NoError(t, second.Record(b.ctx, res, 20), "a repeated record is one record")
	require.ErrorIs(t, second.Record(b.ctx, res, 30), arbortype.ErrInvalidArgument)
	got = b.budgetOf(t, task.ID, "tokens")
	require.Equal(t, int64(120), got.Spent)
	require.Zero(t, got.Reserved)
	require.NoError(t, second.Complete(b.ctx, nil))
	b.requireClean(t)
}

// budgetHandlers: a "turn" spawns an "agent" with the given budget and
// waits; the agent spawns a "tool" that waits for an event nobody sends,
// and once the tool runs asks for 200 tokens (a tool still pending when
// the agent fails would be orphaned, not aborted: the order is the
// test's, not the runner's). attempts counts the agent's runs.
func budgetHandlers(limit arbortype.BudgetLimit, agentRan chan<- error) map[string]machine.Handler {
	toolRan := make(chan struct{}, 1)
	return map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "" {
				if _, err := run.Spawn(ctx, machine.SpawnParams{Kind: "agent", Budgets: []arbortype.BudgetLimit{limit}}); err != nil {
					return err
				}
				return run.Wait(ctx, machine.WaitParams{Policy: arbortype.AllSettled, Phase: "done"})
			}
			return run.Complete(ctx, nil)
		},
		"agent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "" {
				if _, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"}); err != nil {
					return err
				}
				if err := run.Checkpoint(ctx, "tool started", nil); err != nil {
					return err
				}
				select {
				case <-toolRan:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			res, err := run.Reserve(ctx, "tokens", 200)
			agentRan <- err
			if err != nil {
				return err
			}
			if err := run.Record(ctx, res, 150); err != nil {
				return err
			}
			return run.Complete(ctx, json.RawMessage(`"answered"`))
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			select {
			case toolRan <- struct{}{}:
			default:
			}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "never"})
		},
	}
}

// ReleaseReservation gives back all a reservation holds (the call was not
// made): nothing is spent, nothing stays reserved, and the run may reserve
// the whole budget again.
func TestReleaseReservationGivesBackTheHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	res, err := run.Reserve(b.ctx, "tokens", 100)
	require.NoError(t, err)
	require.Equal(t, int64(100), b.budgetOf(t, task.ID, "tokens").Reserved)
	require.NoError(t, run.ReleaseReservation(b.ctx, res))
	got := b.budgetOf(t, task.ID, "tokens")
	require.Zero(t, got.Spent)
	require.Zero(t, got.Reserved)
	again, err := run.Reserve(b.ctx, "tokens", 100)
	require.NoError(t, err, "the whole budget is free again")
	require.NoError(t, run.Record(b.ctx, again, 40))
	require.Equal(t, int64(40), b.budgetOf(t, task.ID, "tokens").Spent)
	require.NoError(t, run.Complete(b.ctx, nil))
}

// A "fail" budget fails the sub-agent that asks for too much (not retried,
// code budget_exhausted) and aborts its foreground subtree; its owner goes
// on.
func TestBudgetFailAbortsTheSubtree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan error, 4)
	fastRunner(t, b, budgetHandlers(arbortype.BudgetLimit{Counter: "tokens", Max: 100}, ran), nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", MaxRetries: 3})
	require.NoError(t, err)
	err = <-ran
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.True(t, over.Ended)
	require.Equal(t, int64(100), over.Budget.Max)
	waitUntil(t, "the turn to complete", func() bool { return b.status(t, turn.ID) == arbortype.StatusCompleted })
	tree, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)
	byKind := map[string]arbortype.Task{}
	for _, x := range tree {
		byKind[x.Kind] = x
	}
	require.Equal(t, arbortype.StatusFailed, byKind["agent"].Status)
	require.Equal(t, arbortype.CodeBudgetExhausted, byKind["agent"].Error.Code)
	require.Zero(t, byKind["agent"].Retries, "a budget's failure is not retried")
	require.Equal(t, arbortype.StatusAborted, byKind["tool"].Status, "the agent's subtree is aborted")
	require.Len(t, ran, 0, "the agent ran once")
	b.requireClean(t)
}

// A "park" budget parks the agent on arbor:budget (listed at the root's
// conversation); raising the budget lets it run again and finish.
func TestBudgetParkThenRaise(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan error, 4)
	fastRunner(t, b, budgetHandlers(arbortype.BudgetLimit{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark}, ran), nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	err = <-ran
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.True(t, over.Ended)
	var pending []arbortype.PendingEvent
	waitUntil(t, "the agent to park", func() bool {
		pending, err = b.engine.PendingEvents(b.ctx, b.conv)
		require.NoError(t, err)
		return len(pending) == 2 // the agent on its budget, the tool on "never"
	})
	var agent int64
	var parkToken string
	for _, p := range pending {
		if p.Name == arbortype.BudgetEvent {
			agent, parkToken = p.TaskID, p.Token
		}
	}
	require.NotZero(t, agent, "the agent awaits its budget: %v", pending)
	b.requireClean(t)
	// The park's token is not an answer: only a raise ends the park (issue
	// 24's audit woke the agent with it, its budget unraised).
	before := b.get(t, agent)
	_, _, err = b.engine.EmitToken(b.ctx, parkToken, []byte(`{"approved": true}`))
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	require.Equal(t, before, b.get(t, agent), "nothing written")

	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: agent, Counter: "tokens", Max: 500, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	require.NoError(t, <-ran, "raised, the agent runs again and its reservation is granted")
	// The tool still awaits; the turn waits on the agent, which waits on
	// nothing (it completed): abort the tool to let the turn go.
	tree, err := b.engine.Children(b.ctx, agent)
	require.NoError(t, err)
	require.Len(t, tree, 1)
	_, err = b.engine.Abort(b.ctx, tree[0].ID)
	require.NoError(t, err)
	waitUntil(t, "the turn to complete", func() bool { return b.status(t, turn.ID) == arbortype.StatusCompleted })
	got := b.budgetOf(t, agent, "tokens")
	require.Equal(t, int64(150), got.Spent)
	require.Zero(t, got.Reserved)
	b.requireClean(t)
}

// A "fail" wall-time budget fails a task that outlives it, whatever it is
// doing, through the runners' maintenance.
func TestWallTimeBudgetFailsTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			started <- struct{}{}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "never"})
		},
	}, nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	<-started
	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: turn.ID, Counter: arbortype.CounterWallTime, Max: 1})
	require.NoError(t, err)
	waitUntil(t, "the turn to fail", func() bool { return b.status(t, turn.ID) == arbortype.StatusFailed })
	got := b.get(t, turn.ID)
	require.Equal(t, arbortype.CodeBudgetExhausted, got.Error.Code)
	require.Contains(t, got.Error.Message, arbortype.CounterWallTime)
	b.requireClean(t)
}

// A budget set after its scope spent counts that spend (budgets are the
// sums of their scope's reservations, however late they are set).
func TestBudgetSetLateCountsEarlierSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tool_calls", Max: arbortype.Unlimited}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, run.Spend(b.ctx, "tool_calls", 1))
	}
	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: task.ID, Counter: "tool_calls", Max: 4, OnExhausted: arbortype.BudgetReturn})
	require.NoError(t, err)
	require.Equal(t, int64(3), b.budgetOf(t, task.ID, "tool_calls").Spent)
	require.NoError(t, run.Spend(b.ctx, "tool_calls", 1))
	require.ErrorIs(t, run.Spend(b.ctx, "tool_calls", 1), arbortype.ErrBudgetExhausted)
	require.Equal(t, int64(4), b.budgetOf(t, 0, "tool_calls").Spent)
	b.requireClean(t)
}

// Bad input to budgets is refused with a clear error and writes nothing.
func TestBudgetBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := b.conv + "-other"
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetReturn}}})
	require.NoError(t, err)
	foreign, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: other, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	before := b.budgetRows(t)

	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"negative reserve", second(run.Reserve(b.ctx, "tokens", -1)), arbortype.ErrInvalidArgument},
		{"negative spend", run.Spend(b.ctx, "tokens", -5), arbortype.ErrInvalidArgument},
		{"unknown counter", second(run.Reserve(b.ctx, "tokenz", 1)), arbortype.ErrUnknownCounter},
		{"malformed counter", second(run.Reserve(b.ctx, "Tokens; DROP", 1)), arbortype.ErrInvalidArgument},
		{"wall time reserved", second(run.Reserve(b.ctx, arbortype.CounterWallTime, 1)), arbortype.ErrInvalidArgument},
		{"too large", second(run.Reserve(b.ctx, "tokens", 1<<60)), arbortype.ErrInvalidArgument},
		{"over the budget", second(run.Reserve(b.ctx, "tokens", 101)), arbortype.ErrBudgetExhausted},
		{"record a forged reservation", run.Record(b.ctx, arbortype.Reservation{ID: 999999, TaskID: task.ID}, 1), arbortype.ErrNotFound},
		{"record another task's", run.Record(b.ctx, arbortype.Reservation{ID: 1, TaskID: foreign.ID}, 1), arbortype.ErrInvalidArgument},
		{"set: unknown conversation", second(b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: "nope", Counter: "tokens", Max: 1})), arbortype.ErrNotFound},
		{"set: unknown task", second(b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: 1 << 40, Counter: "tokens", Max: 1})), arbortype.ErrNotFound},
		{"set: foreign task", second(b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: foreign.ID, Counter: "tokens", Max: 1})), arbortype.ErrForeignTask},
		{"set: negative max", second(b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens", Max: -1})), arbortype.ErrInvalidArgument},
		{"set: bad action", second(b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens", Max: 1, OnExhausted: "explode"})), arbortype.ErrInvalidArgument},
		{"create: bad budget", func() error {
			_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
				Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: -3}}})
			return err
		}(), arbortype.ErrInvalidArgument},
	} {
		require.ErrorIs(t, c.err, c.want, c.what)
	}
	require.Equal(t, before, b.budgetRows(t), "nothing written")
	require.NoError(t, run.Complete(b.ctx, nil))
	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, TaskID: task.ID, Counter: "tokens", Max: 1})
	require.ErrorIs(t, err, arbortype.ErrSettled)
	b.requireClean(t)
}

func second[T any](_ T, err error) error { return err }

// Pruning a conversation's old turns keeps what they spent counted in the
// conversation's budgets (a session's budget is not reset by retention),
// and the budgets still equal their reservations (invariant 10).
func TestPruneKeepsTheSessionSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var turns []int64
	for i := range 3 {
		turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
			ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000}},
			Budgets:             []arbortype.BudgetLimit{{Counter: "tokens", Max: 500}}})
		require.NoError(t, err)
		lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
		require.NoError(t, err)
		run, err := lease.Start(b.ctx, turn.ID)
		require.NoError(t, err)
		require.NoError(t, run.Spend(b.ctx, "tokens", int64(100*(i+1))))
		if i == 0 {
			_, err = run.Reserve(b.ctx, "tokens", 50) // never recorded: spent in full by the next reservation
			require.NoError(t, err)
		}
		require.NoError(t, run.Complete(b.ctx, nil))
		require.NoError(t, lease.Release(b.ctx))
		turns = append(turns, turn.ID)
	}
	// The conversation is in use: a fourth turn waits its turn.
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	before := b.budgetOf(t, 0, "tokens")
	require.Equal(t, int64(650), before.Spent)
	require.Zero(t, before.Reserved)

	res, err := b.engine.Prune(b.ctx, tasks.PruneParams{OlderThan: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Turns, "every settled turn but the newest")
	require.Equal(t, int64(3), res.Reservations)
	after := b.budgetOf(t, 0, "tokens")
	require.Equal(t, int64(650), after.Spent, "the pruned turns' spend stays")
	require.Zero(t, after.Reserved)
	require.Equal(t, int64(350), after.Pruned)
	all, err := b.engine.Budgets(b.ctx, b.conv)
	require.NoError(t, err)
	require.Len(t, all.Budgets, 2, "the conversation's and the newest turn's")
	require.Equal(t, turns[2], all.Budgets[1].TaskID)
	b.requireClean(t)
}

// A raise racing the park of a run over its budget is never lost: after
// both, the task either got its reservation (the raise came first) or was
// parked and woken by the raise — never parked on arbor:budget with room
// left in the budget. Many rounds, the raise and the reservation released
// together.
func TestBudgetRaiseRacingThePark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for round := range 20 {
		conv := fmt.Sprintf("%s-%d", b.conv, round)
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn",
			ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark}}})
		require.NoError(t, err)
		lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, conv, nil)
		require.NoError(t, err)
		run, err := lease.Start(b.ctx, task.ID)
		require.NoError(t, err)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var reserveErr error
		wg.Go(func() {
			<-start
			_, reserveErr = run.Reserve(b.ctx, "tokens", 150)
		})
		wg.Go(func() {
			<-start
			_, err := b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 1000, OnExhausted: arbortype.BudgetPark})
			require.NoError(t, err)
		})
		close(start)
		wg.Wait()
		got := b.get(t, task.ID)
		if reserveErr == nil {
			require.Equal(t, arbortype.StatusRunning, got.Status, "round %d: reserved after the raise", round)
			require.NoError(t, run.Complete(b.ctx, nil))
		} else {
			require.ErrorIs(t, reserveErr, arbortype.ErrBudgetExhausted, "round %d", round)
			require.Equal(t, arbortype.StatusPending, got.Status, "round %d: parked before the raise, and woken by it", round)
			require.NotNil(t, got.Delivered, "round %d", round)
			require.Equal(t, arbortype.BudgetEvent, got.Delivered.Name)
		}
		require.NoError(t, lease.Release(b.ctx))
		b.requireClean(t, conv)
	}
}
