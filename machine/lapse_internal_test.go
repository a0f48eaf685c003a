package machine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// A flush while the node's lease is not usable applies its outcomes and
// claims nothing. The database would still take the claim, under a holder
// row that has not expired yet, but the runner would not start what it
// took: the task would stay running with no run until a reopen requeued
// it, or until the node that took the conversation over counted it as a
// restart. Here a handler completes its task just after the fence fired;
// the next turn, runnable once the first is done, must be claimed once,
// by the reopen after the lease is confirmed again: its log shows one
// start.
func TestFlushClaimsNothingWhileTheLeaseIsNotUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var ir internalRunner
	var nextCalls atomic.Int32
	ir = startInternalRunner(t, map[string]Handler{
		"first": func(_ context.Context, run *Run) error {
			// The fence point passed (as after a freeze): the fence fires.
			l := ir.r.lease
			l.confirmed.Store(l.since(time.Now()) + int64(l.margin()) - 1)
			if l.checkFence(time.Now()) {
				return errors.New("the fence did not fire") // fails the test below: the turn is not completed
			}
			// The run's token is still the task's: its ending is applied.
			return run.Complete(context.Background(), nil)
		},
		"next": func(ctx context.Context, run *Run) error {
			nextCalls.Add(1)
			return run.Complete(ctx, nil)
		},
	}, nil)
	first, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "first"})
	require.NoError(t, err)
	next, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "next"})
	require.NoError(t, err)
	waitFor(t, "both turns to complete", func() bool {
		return ir.task(t, first.ID).Status == arbortype.StatusCompleted && ir.task(t, next.ID).Status == arbortype.StatusCompleted
	})

	entries, err := ir.eng.ReadLog(ctx, ir.conv, 0, 1000)
	require.NoError(t, err)
	var starts []arbortype.Status
	for _, e := range entries {
		if e.TaskID == next.ID && e.Kind == arbortype.LogKindStatus {
			starts = append(starts, e.Status)
		}
	}
	// One claim of the next turn: a claim of the held conversation that
	// waited behind the flush's row lock while the fence fired is rolled
	// back (errFencedClaim), not committed and requeued by the reopen.
	require.Equal(t, []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusCompleted}, starts, "the next turn's status entries")
	require.EqualValues(t, 1, nextCalls.Load(), "the next turn's handler was entered once")
	require.Zero(t, ir.task(t, next.ID).Attempt, "no restart counted")
}

// TestAClaimTheFenceBeatRollsBack: the fence fires while a claim's
// transaction runs, after its statement claimed a task and before its
// commit (the test fires it from inside the claim). The claim rolls back
// (errFencedClaim): the task is claimed once, after the lease is
// confirmed again, and its log shows one start. Without the check the
// claim committed, its run was held lapsed and never entered, and the
// reopen requeued it and claimed it again.
func TestAClaimTheFenceBeatRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	ir := startInternalRunner(t, map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error {
			calls.Add(1)
			return run.Complete(ctx, nil)
		},
	}, nil)
	r := ir.r
	var fired atomic.Bool
	r.mu.Lock()
	r.testClaimed = func(runs []arbortype.Task) {
		if len(runs) > 0 && fired.CompareAndSwap(false, true) {
			// The fence point passed (as after a freeze): the fence fires.
			l := r.lease
			l.confirmed.Store(l.since(time.Now()) + int64(l.margin()) - 1)
			l.checkFence(time.Now())
		}
	}
	r.mu.Unlock()
	// CreateTx: Create would start the turn in its create (docs/design.md
	// §3.18), with no claim for the fence to beat.
	var turn arbortype.Task
	require.NoError(t, pgx.BeginFunc(ctx, ir.pool, func(tx pgx.Tx) error {
		var err error
		turn, _, err = ir.eng.CreateTx(ctx, tx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "turn"})
		return err
	}))
	waitFor(t, "the turn to complete", func() bool { return ir.task(t, turn.ID).Status == arbortype.StatusCompleted })
	require.True(t, fired.Load(), "the fence fired inside a claim")

	entries, err := ir.eng.ReadLog(ctx, ir.conv, 0, 1000)
	require.NoError(t, err)
	var statuses []arbortype.Status
	for _, e := range entries {
		if e.TaskID == turn.ID && e.Kind == arbortype.LogKindStatus {
			statuses = append(statuses, e.Status)
		}
	}
	require.Equal(t, []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusCompleted}, statuses,
		"one claim: the one the fence beat rolled back")
	require.EqualValues(t, 1, calls.Load())
	require.Zero(t, ir.task(t, turn.ID).Attempt)
}
