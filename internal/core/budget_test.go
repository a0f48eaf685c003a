package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestReserveRefusalsAreNotDatabaseErrors: a reservation of a counter no
// budget names, and one over a budget whose action is BudgetReturn, are
// refusals the handler decides on: their sentinels, never ErrDatabase
// ("database error: …"), and nothing is written.
func TestReserveRefusalsAreNotDatabaseErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetReturn}}})
	require.NoError(t, err)
	run := b.start(t, turn.ID)
	reserve := func(counter string, amount int64) error {
		_, err := b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
			Counter: counter, Amount: amount, Key: "k-" + counter})
		return err
	}
	before := b.snapshot(t)
	budgets, err := b.engine.Budgets(b.ctx, b.conv)
	require.NoError(t, err)

	err = reserve("tokenz", 1)
	require.ErrorIs(t, err, arbortype.ErrUnknownCounter)
	require.NotErrorIs(t, err, arbortype.ErrDatabase)

	err = reserve("tokens", 101)
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)
	require.NotErrorIs(t, err, arbortype.ErrDatabase)
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.Equal(t, "tokens", over.Budget.Counter)
	require.EqualValues(t, 101, over.Wanted)
	require.False(t, over.Ended, "BudgetReturn: the run goes on")

	require.Equal(t, before, b.snapshot(t), "nothing written")
	after, err := b.engine.Budgets(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, budgets.Spend, after.Spend)
	for i := range budgets.Budgets {
		require.Equal(t, budgets.Budgets[i].Reserved, after.Budgets[i].Reserved)
		require.Equal(t, budgets.Budgets[i].Spent, after.Budgets[i].Spent)
	}
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
}

// TestReserveOfNoRunWritesNothing: the one-statement reservation refuses
// as the engine's transaction did — a stale token ErrLeaseLost, a task no
// longer running ErrNotRunning, a task of another conversation
// ErrNotFound — and writes nothing; a key reserved before returns its
// reservation again (a write retried after a lost answer), charged once.
func TestReserveOfNoRunWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}})
	require.NoError(t, err)
	run := b.start(t, turn.ID)
	reserve := func(conv string, token int64, key string) (core.ReserveResult, error) {
		return b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: conv, TaskID: run.ID, Token: token,
			Counter: "tokens", Amount: 10, Key: key})
	}
	first, err := reserve(b.conv, run.Token, "k")
	require.NoError(t, err)
	again, err := reserve(b.conv, run.Token, "k")
	require.NoError(t, err)
	require.Equal(t, first.Reservation, again.Reservation)
	got, err := b.engine.Budget(b.ctx, b.conv, turn.ID, "tokens")
	require.NoError(t, err)
	require.EqualValues(t, 10, got.Reserved, "charged once")

	before, records := b.snapshot(t), b.recordSnapshot(t)
	_, err = reserve(b.conv, run.Token+1, "stale")
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	_, err = reserve(b.conv+"-other", run.Token, "elsewhere")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	require.Equal(t, before, b.snapshot(t))
	require.Equal(t, records, b.recordSnapshot(t))

	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
	records = b.recordSnapshot(t)
	_, err = reserve(b.conv, run.Token, "after")
	require.ErrorIs(t, err, arbortype.ErrNotRunning)
	require.Equal(t, records, b.recordSnapshot(t))
	again, err = reserve(b.conv, run.Token, "k")
	require.NoError(t, err, "a key reserved before is found before the run is checked, as it was")
	require.Equal(t, first.Reservation, again.Reservation)
}
