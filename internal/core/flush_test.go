package core_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// flush applies outs in one transaction, as a runner's completer does.
func (b *bundle) flush(t *testing.T, outs []core.Outcome, slow bool) core.FlushResult {
	t.Helper()
	var xact int64
	res, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.FlushResult, error) {
		return b.engine.C.Flush(b.ctx, tx, outs, core.ClaimParamsFor{Holder: b.lease(t).HolderID}, slow, &xact, nil)
	})
	require.NoError(t, err)
	require.NotZero(t, xact, "the flush's transaction id is known")
	require.Len(t, res.Results, len(outs))
	return res
}

// A take-over races a batched complete: the task was recovered and started
// again under a new token before the flush ran. Every outcome of the old
// run in the batch — complete, wait, spawn, fail, sleep — matches nothing
// and is refused as the old run's alone; the new run is untouched, and the
// other outcomes of the batch apply. On both paths: set-based, and one by
// one.
func TestFlushStaleTokensMatchNothing(t *testing.T) {
	t.Parallel()
	for _, slow := range []bool{false, true} {
		name := "set-based"
		if slow {
			name = "one by one"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			turn := b.root(t, "turn")
			var stale, fresh []arbortype.Task
			for range 5 {
				c := b.child(t, turn.ID, "tool")
				old := b.start(t, c.ID)
				_, err := b.engine.Recover(b.ctx, c.ID) // the take-over's recovery
				require.NoError(t, err)
				stale = append(stale, old)
				fresh = append(fresh, b.start(t, c.ID)) // the new holder's run
			}
			ok := b.child(t, turn.ID, "tool")
			okRun := b.start(t, ok.ID)
			before := map[int64]arbortype.Task{}
			for _, f := range fresh {
				before[f.ID] = b.get(t, f.ID)
			}

			outs := []core.Outcome{
				{Kind: core.OutComplete, TaskID: stale[0].ID, Token: stale[0].Token, ConversationID: b.conv, Result: js(`"late"`)},
				{Kind: core.OutWait, TaskID: stale[1].ID, Token: stale[1].Token, ConversationID: b.conv,
					Wait: core.WaitParams{Policy: arbortype.AllSettled}},
				{Kind: core.OutSpawn, TaskID: stale[2].ID, Token: stale[2].Token, ConversationID: b.conv,
					Spawns: []core.CreateParams{{CreateParams: arbortype.CreateParams{ConversationID: b.conv, OwnerID: stale[2].ID, Kind: "x", IdempotencyKey: "arbor:k"}, OwnerToken: stale[2].Token}}},
				{Kind: core.OutFail, TaskID: stale[3].ID, Token: stale[3].Token, ConversationID: b.conv,
					Error: arbortype.TaskError{Message: "late failure"}},
				{Kind: core.OutSleep, TaskID: stale[4].ID, Token: stale[4].Token, ConversationID: b.conv, WakeAt: time.Now().Add(time.Hour)},
				{Kind: core.OutComplete, TaskID: okRun.ID, Token: okRun.Token, ConversationID: b.conv, Result: js(`"fine"`)},
			}
			res := b.flush(t, outs, slow)
			for i := range 5 {
				err := res.Results[i].Err
				require.Error(t, err, "outcome %d of the old run", i)
				require.True(t, errorsIsAny(err, arbortype.ErrNotRunning, arbortype.ErrLeaseLost, arbortype.ErrAborted), "outcome %d: %v", i, err)
			}
			require.NoError(t, res.Results[5].Err)
			for _, f := range fresh {
				require.Equal(t, before[f.ID], b.get(t, f.ID), "the new run of task %d is untouched", f.ID)
			}
			require.Equal(t, arbortype.StatusCompleted, b.get(t, ok.ID).Status)
			kids, err := b.engine.Children(b.ctx, stale[2].ID)
			require.NoError(t, err)
			require.Empty(t, kids, "the old run spawned nothing")
		})
	}
}

// A batch completes the children of waiting parents and of completing ones
// together: the waits are satisfied and the parents woken, the completing
// parents completed, up the tree, in the flush's own transaction — and the
// woken parents are claimed in it when the flush's holder holds their
// conversation.
func TestFlushReconcilesOwnersAndClaimsTheWoken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn := b.root(t, "turn")
	turnRun := b.start(t, turn.ID)
	a := b.child(t, turn.ID, "agent")
	aRun := b.start(t, a.ID)
	tool := b.child(t, a.ID, "tool")
	toolRun := b.start(t, tool.ID)
	// The agent completes while its tool runs (completing); the turn waits
	// on the agent.
	_, err := b.engine.Complete(b.ctx, a.ID, aRun.Token, js(`"agent done"`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleting, b.get(t, a.ID).Status)
	_, err = b.engine.WaitForChildren(b.ctx, turn.ID, turnRun.Token, core.WaitParams{ChildIDs: []int64{a.ID}, Policy: arbortype.AllSettled, Phase: "after"})
	require.NoError(t, err)

	var xact int64
	res, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.FlushResult, error) {
		return b.engine.C.Flush(b.ctx, tx, []core.Outcome{
			{Kind: core.OutComplete, TaskID: tool.ID, Token: toolRun.Token, ConversationID: b.conv, Result: js(`"tool done"`)},
		}, core.ClaimParamsFor{Holder: b.lease(t).HolderID, Limit: 10}, false, &xact, nil)
	})
	require.NoError(t, err)
	require.NoError(t, res.Results[0].Err)
	require.Equal(t, arbortype.StatusCompleted, b.get(t, tool.ID).Status)
	require.Equal(t, arbortype.StatusCompleted, b.get(t, a.ID).Status, "the completing agent completed with its last child")
	require.Len(t, res.Claimed, 1, "the woken turn is claimed in the flush")
	require.Equal(t, turn.ID, res.Claimed[0].ID)
	require.Equal(t, "after", res.Claimed[0].Phase)
	require.Equal(t, arbortype.StatusRunning, b.get(t, turn.ID).Status)
}

func errorsIsAny(err error, targets ...error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// A deadlock met by an outcome applied one by one is the flush's, not the
// outcome's: the flush's transaction runs again, and the run's sleep is
// written. Concurrency limits made it possible (design.md §3.15: a run's
// end gives its slots back, a start takes them, and one flush does both
// for many tasks, so two transactions can lock two limits in opposite
// orders). Here another transaction holds limit "kind:dl-y" while the
// flush's sleep of x has taken "kind:dl-x" and its sleep of y waits for
// "kind:dl-y"; the other then asks for "kind:dl-x". The flush, which looks
// for deadlocks first, finds it and is refused with it; before the
// fix, that refusal became the sleep's own error, which the runner gave
// the handler, and the task failed with "deadlock detected" (make chaos,
// TestTenantsLimitsUnderKills).
func TestFlushRetriesADeadlockOfAnOutcome(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:dl-x", 10))
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:dl-y", 10))
	turn := b.root(t, "turn")
	x := b.start(t, b.child(t, turn.ID, "dl-x").ID)
	y := b.start(t, b.child(t, turn.ID, "dl-y").ID)

	other, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(b.ctx) }()
	var otherPID int
	require.NoError(t, other.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&otherPID))
	// The other looks for deadlocks long after the flush does: the flush
	// finds this one.
	_, err = other.Exec(b.ctx, `SET LOCAL deadlock_timeout = '1min'`)
	require.NoError(t, err)
	_, err = other.Exec(b.ctx, `SELECT 1 FROM `+b.schema+`.concurrency_limits WHERE key = 'kind:dl-y' FOR UPDATE`)
	require.NoError(t, err)

	wake := time.Now().Add(time.Hour)
	outs := []core.Outcome{
		{Kind: core.OutSleep, TaskID: x.ID, Token: x.Token, ConversationID: b.conv, WakeAt: wake},
		{Kind: core.OutSleep, TaskID: y.ID, Token: y.Token, ConversationID: b.conv, WakeAt: wake},
	}
	type flushed struct {
		res core.FlushResult
		err error
	}
	done := make(chan flushed, 1)
	go func() {
		var xact int64
		res, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.FlushResult, error) {
			return b.engine.C.Flush(b.ctx, tx, outs, core.ClaimParamsFor{Holder: b.lease(t).HolderID}, true, &xact, nil)
		})
		done <- flushed{res, err}
	}()
	// The flush waits for kind:dl-y, which the other holds.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, otherPID).Scan(&n))
		return n > 0
	}, time.Minute, 5*time.Millisecond, "the flush waits for the other's lock")
	// The other asks for kind:dl-x, which the flush holds: a deadlock, which
	// the flush finds and is refused with; the other then gets its lock,
	// and lets both go.
	_, err = other.Exec(b.ctx, `SELECT 1 FROM `+b.schema+`.concurrency_limits WHERE key = 'kind:dl-x' FOR UPDATE`)
	require.NoError(t, err, "the flush is the one refused")
	require.NoError(t, other.Rollback(b.ctx))

	f := <-done
	require.NoError(t, f.err)
	require.Len(t, f.res.Results, 2)
	for i, r := range f.res.Results {
		require.NoError(t, r.Err, "outcome %d: a deadlock is the transaction's, retried, not the outcome's", i)
	}
	require.Equal(t, arbortype.StatusSleeping, b.get(t, x.ID).Status)
	require.Equal(t, arbortype.StatusSleeping, b.get(t, y.ID).Status)
}
