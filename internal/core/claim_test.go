package core_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/tasks"
)

// TestStartRaceOneWinner: two starts of the same task, driven in a chosen
// order: both queue on the task's row lock (held by the test), and the
// first to queue wins; the second, finding the task running, gets
// ErrAlreadyRunning. Both orders, so neither side of the race is luck.
func TestStartRaceOneWinner(t *testing.T) {
	t.Parallel()
	for _, firstWins := range []int{0, 1} {
		t.Run(fmt.Sprintf("starter_%d_first", firstWins), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			task := b.root(t, "race")
			b.lease(t)
			r := newRacer(t, b)
			var tokens [2]int64
			start := func(i int) func(e *enginetest.Engine) error {
				return func(e *enginetest.Engine) error {
					got, err := e.Start(b.ctx, task.ID)
					tokens[i] = got.Token
					return err
				}
			}
			r.holdTask(task.ID)
			r.queue(start(firstWins))
			r.queue(start(1 - firstWins))
			errs := r.release()
			require.NoError(t, errs[0], "the first to queue wins")
			require.ErrorIs(t, errs[1], arbortype.ErrAlreadyRunning)
			got := b.get(t, task.ID)
			require.Equal(t, arbortype.StatusRunning, got.Status)
			require.Equal(t, tokens[firstWins], got.Token, "the winner's token holds the run")
			_, err := b.engine.AbortConversation(b.ctx, b.conv)
			require.NoError(t, err)
		})
	}
}

// TestClaimNeverHandsOutATaskTwice: concurrent batch claimers over the same
// pending tasks get disjoint sets that cover them all.
func TestClaimNeverHandsOutATaskTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 300
	for range n {
		b.root(t, "job")
	}
	var (
		mu   sync.Mutex
		seen = map[int64]int64{} // task -> token
		wg   sync.WaitGroup
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := b.engine.Claim(b.ctx, b.conv, 7)
				if !errors.Is(err, nil) {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, task := range got {
					if _, dup := seen[task.ID]; dup {
						t.Errorf("task %d claimed twice", task.ID)
					}
					seen[task.ID] = task.Token
					if task.Status != arbortype.StatusRunning {
						t.Errorf("claimed task %d is %s", task.ID, task.Status)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, n)
	tokens := map[int64]bool{}
	for _, tok := range seen {
		require.False(t, tokens[tok], "tokens are unique per start")
		tokens[tok] = true
	}
	_, err := b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestClaimAndStartBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.root(t, "job")
	_, err := b.engine.Claim(b.ctx, b.conv, 0)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.Claim(b.ctx, b.conv, 10_001)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.Start(b.ctx, 1<<60)
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	done := reach(t, b, arbortype.StatusCompleted, false).task
	before := b.snapshot(t)
	_, err = b.engine.Start(b.ctx, done.ID)
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
	require.Equal(t, before, b.snapshot(t))

	aborted := reach(t, b, arbortype.StatusOrphaned, false).task
	_, err = b.engine.Start(b.ctx, aborted.ID)
	require.ErrorIs(t, err, arbortype.ErrAborted)
}

func TestCheckpointAndHeartbeatAreFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.start(t, b.root(t, "turn").ID)
	saved, err := b.engine.Checkpoint(b.ctx, run.ID, run.Token, "searching", js(`{"page": 1}`))
	require.NoError(t, err)
	require.Equal(t, "searching", saved.Phase)
	require.True(t, !saved.LeaseExpiresAt.Before(*run.LeaseExpiresAt), "checkpoint extends the lease")
	_, err = b.engine.Heartbeat(b.ctx, run.ID, run.Token)
	require.NoError(t, err)

	// The holder dies; the task is recovered and started again: the old
	// token is fenced off.
	_, err = b.engine.Recover(b.ctx, run.ID)
	require.NoError(t, err)
	before := b.snapshot(t)
	_, err = b.engine.Checkpoint(b.ctx, run.ID, run.Token, "stale", nil)
	require.ErrorIs(t, err, arbortype.ErrNotRunning)
	require.Equal(t, before, b.snapshot(t))

	rerun := b.start(t, run.ID)
	require.NotEqual(t, run.Token, rerun.Token)
	require.Equal(t, 1, rerun.Attempt)
	require.Equal(t, "searching", rerun.Phase, "phase and state survive recovery")
	before = b.snapshot(t)
	_, err = b.engine.Checkpoint(b.ctx, run.ID, run.Token, "stale", nil)
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	_, err = b.engine.Heartbeat(b.ctx, run.ID, run.Token)
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	_, err = b.engine.Fail(b.ctx, run.ID, run.Token, arbortype.TaskError{Message: "x"})
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	require.Equal(t, before, b.snapshot(t), "a stale token writes nothing")

	// Bad checkpoint payloads are refused.
	_, err = b.engine.Checkpoint(b.ctx, rerun.ID, rerun.Token, "p", js(`{`))
	require.ErrorIs(t, err, arbortype.ErrInvalidJSON)
	_, err = b.engine.Checkpoint(b.ctx, 1<<60, 1, "p", nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	require.Equal(t, before, b.snapshot(t))

	// An aborted task's holder learns it at its next write.
	_, err = b.engine.Abort(b.ctx, rerun.ID)
	require.NoError(t, err)
	_, err = b.engine.Checkpoint(b.ctx, rerun.ID, rerun.Token, "after", nil)
	require.ErrorIs(t, err, arbortype.ErrAborted)
}

func TestFailRecordsBoundedError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.start(t, b.root(t, "turn").ID)
	long := make([]byte, 3*tasks.MaxErrorMessageBytesDefault)
	for i := range long {
		long[i] = 'x'
	}
	_, err := b.engine.Fail(b.ctx, run.ID, run.Token, arbortype.TaskError{Message: "m", Detail: js(`{`)})
	require.ErrorIs(t, err, arbortype.ErrInvalidJSON)
	require.Equal(t, arbortype.StatusRunning, b.get(t, run.ID).Status, "a refused fail writes nothing")

	failed, err := b.engine.Fail(b.ctx, run.ID, run.Token, arbortype.TaskError{Message: string(long), Detail: js(`{"tool": "search"}`)})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusFailed, failed.Status)
	require.LessOrEqual(t, len(failed.Error.Message), tasks.MaxErrorMessageBytesDefault)
	require.JSONEq(t, `{"tool": "search"}`, string(failed.Error.Detail))
}
