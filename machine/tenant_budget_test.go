package machine_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// A reservation still open when the prune deletes its task's rows is
// spent in full on the tenant's budget it charged (as a lapse would
// spend it), so the tenant's budget is never left holding room for a run
// long over; and a whole-database check agrees with every sum after.
func TestPruneReleasesTenantReservations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.conv + "-tenant"
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 1000})
	require.NoError(t, err)
	for i := range 2 {
		turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Tenant: tenant, Kind: "turn"})
		require.NoError(t, err)
		lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
		require.NoError(t, err)
		run, err := lease.Start(b.ctx, turn.ID)
		require.NoError(t, err)
		if i == 0 {
			_, err = run.Reserve(b.ctx, "tokens", 50) // never recorded, and no later reservation lapses it
			require.NoError(t, err)
		}
		require.NoError(t, run.Complete(b.ctx, nil))
		require.NoError(t, lease.Release(b.ctx))
	}
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Tenant: tenant, Kind: "turn"})
	require.NoError(t, err)
	bs, err := b.engine.TenantBudgets(b.ctx, tenant)
	require.NoError(t, err)
	require.EqualValues(t, 50, bs[0].Reserved)

	res, err := b.engine.Prune(b.ctx, tasks.PruneParams{OlderThan: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Turns)
	require.Equal(t, int64(1), res.Reservations)
	bs, err = b.engine.TenantBudgets(b.ctx, tenant)
	require.NoError(t, err)
	require.Zero(t, bs[0].Reserved, "released by the prune")
	require.EqualValues(t, 50, bs[0].Spent, "spent in full")
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Empty(t, vs)
}
