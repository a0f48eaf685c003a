package machine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// TestEndingWritesAreNotReportedStopped: a handler's ending call whose
// write committed is never told the run was stopped — not while the
// watchdog reads back runs on every poll and every notification (a run's
// task leaving running by the run's own write is not a task stopped
// elsewhere), nor for a CompleteTx committed in the handler's own
// transaction (issue 19: "a committed CompleteTx is reported as
// cancelled"). Conversations loop await → emit → complete, and complete
// through CompleteTx and Commit, under a fast poll.
func TestEndingWritesAreNotReportedStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	parked := map[string]chan int64{}
	committed := make(chan error, 1000)
	ch := func(c string) chan int64 {
		mu.Lock()
		defer mu.Unlock()
		if parked[c] == nil {
			parked[c] = make(chan int64, 1)
		}
		return parked[c]
	}
	fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "woken" {
				tx, err := b.pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
				if err := run.CompleteTx(ctx, tx, nil); err != nil {
					return err
				}
				err = tx.Commit(ctx)
				committed <- err
				return err
			}
			err := run.AwaitEvent(ctx, machine.AwaitParams{Name: "go", Phase: "woken"})
			require.NoError(t, err, "an await that landed is not reported stopped")
			ch(run.Task.ConversationID) <- run.Task.ID
			return nil
		},
	}, func(c *machine.RunnerConfig) { c.PollInterval = 10 * time.Millisecond })
	var wg sync.WaitGroup
	const convs, rounds = 4, 25
	for w := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conv := fmt.Sprintf("%s-%d", b.conv, w)
			for range rounds {
				turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
				require.NoError(t, err)
				select {
				case <-ch(conv):
				case <-time.After(time.Minute):
					require.FailNow(t, "the turn never parked", "turn %d", turn.ID)
				}
				_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: conv, TaskID: turn.ID, Name: "go"})
				require.NoError(t, err)
				got, err := b.engine.AwaitSettled(b.ctx, turn.ID)
				require.NoError(t, err)
				require.Equal(t, arbortype.StatusCompleted, got.Status)
			}
		}()
	}
	wg.Wait()
	// A turn is settled once its Commit landed, which may be before its
	// handler reports it: wait for every report, never close the channel
	// under a handler still sending.
	for i := range convs * rounds {
		select {
		case err := <-committed:
			require.NoError(t, err, "a CompleteTx's Commit is never cancelled by the runner")
		case <-time.After(time.Minute):
			require.FailNow(t, "a woken turn never reported its Commit", "%d of %d reported", i, convs*rounds)
		}
	}
	var all []string
	for w := range convs {
		all = append(all, fmt.Sprintf("%s-%d", b.conv, w))
	}
	b.requireClean(t, all...)
}

// TestRunAddressesItsTaskWhateverTheHandlerDoesToTask: Run.Task is the
// handler's to read (and, as it happens, to change); the run's writes go
// to the task it claimed all the same (issue 24: with
// run.Task.ConversationID changed, Progress and Wait were written and
// Checkpoint failed with "database error: … %!w(<nil>)").
func TestRunAddressesItsTaskWhateverTheHandlerDoesToTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	errs := make(chan error, 3)
	fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			run.Task.ConversationID, run.Task.ID = "someone-else", run.Task.ID+1000
			errs <- run.Checkpoint(ctx, "halfway", nil)
			errs <- run.Progress(ctx, "step", []byte(`1`))
			err := run.Complete(ctx, []byte(`"done"`))
			errs <- err
			return err
		},
	}, nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, <-errs)
	}
	got, err := b.engine.AwaitSettled(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, got.Status)
	require.Equal(t, "halfway", got.Phase)
	require.JSONEq(t, `"done"`, string(got.Result))
	b.requireClean(t)
}

// TestUncommittedCompleteTxIsCaughtWhateverTheHandlerDoesToTask: a
// handler changes run.Task.ID, then ends its run with CompleteTx in a
// transaction it rolls back. The run's check that the transaction
// committed reads the run's own task, not run.Task: the task fails with
// ending_not_committed instead of staying running (issue 24's audit found
// it left running, the outcome reported completed).
func TestUncommittedCompleteTxIsCaughtWhateverTheHandlerDoesToTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	rep, err := lease.Work(b.ctx, turn.ID, func(ctx context.Context, run *machine.Run) error {
		run.Task.ID += 100_000
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := run.CompleteTx(ctx, tx, []byte(`"x"`)); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
	require.NoError(t, err)
	require.Equal(t, machine.OutcomeFailed, rep.Outcome.Kind)
	got := b.get(t, turn.ID)
	require.Equal(t, arbortype.StatusFailed, got.Status)
	require.Equal(t, arbortype.CodeEndingNotCommitted, got.Error.Code)
	b.requireClean(t)
}

// TestAwaitOfArborsOwnEventIsRefused: arbortype.BudgetEvent is a budget
// park's, raised only by a raise; a handler's await of it is refused and
// writes nothing (issue 24).
func TestAwaitOfArborsOwnEventIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, mustConversation(t, b), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	runs, err := lease.Claim(b.ctx, 1)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	err = runs[0].AwaitEvent(b.ctx, machine.AwaitParams{Name: arbortype.BudgetEvent})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	require.Equal(t, arbortype.StatusRunning, b.status(t, runs[0].Task.ID), "nothing written")
	require.NoError(t, runs[0].Complete(b.ctx, nil))
	b.requireClean(t)
}

// mustConversation creates the bundle's conversation with one turn.
func mustConversation(t *testing.T, b *bundle) string {
	t.Helper()
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	return b.conv
}
