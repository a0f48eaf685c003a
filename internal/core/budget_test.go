package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// TestReserveRefusalsAreNotDatabaseErrors: a reservation of a counter no
// budget names, and one over a budget whose action is BudgetReturn, are
// refusals the handler decides on: their sentinels, never ErrDatabase
// ("database error: …"), and nothing is written.
func TestReserveRefusalsAreNotDatabaseErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn",
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
	require.ErrorIs(t, err, tasks.ErrUnknownCounter)
	require.NotErrorIs(t, err, tasks.ErrDatabase)

	err = reserve("tokens", 101)
	require.ErrorIs(t, err, tasks.ErrBudgetExhausted)
	require.NotErrorIs(t, err, tasks.ErrDatabase)
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
