package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// fastRunner is a runner configured for tests: short leases and polls.
func fastRunner(t *testing.T, b *bundle, handlers map[string]machine.Handler, tweak func(*machine.RunnerConfig)) *machine.Runner {
	t.Helper()
	cfg := &machine.RunnerConfig{
		LeaseDuration: time.Second,
		PollInterval:  50 * time.Millisecond,
		IdleRelease:   200 * time.Millisecond,
		ShutdownGrace: 2 * time.Second,
		Waker:         &machine.WakerConfig{RiverTestOnly: true},
	}
	if tweak != nil {
		tweak(cfg)
	}
	r, err := machine.NewRunner(b.engine, handlers, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	return r
}

// waitUntil polls cond until it holds; the bound is for a broken test.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bundle) requireClean(t *testing.T, convs ...string) {
	t.Helper()
	for _, c := range append(convs, b.conv) {
		vs, err := b.engine.Check(b.ctx, c)
		require.NoError(t, err)
		require.Empty(t, vs, "invariant violations in %s", c)
	}
}

func TestRunnerRunsATurnWithParallelToolCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	resumed := 0
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				waited, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				mu.Lock()
				resumed++
				mu.Unlock()
				return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"tools": %d}`, len(waited))))
			}
			var ids []int64
			for i := range 3 {
				c, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool", Input: json.RawMessage(fmt.Sprint(i))})
				if err != nil {
					return err
				}
				ids = append(ids, c.ID)
			}
			_, err := run.Wait(ctx, ids, tasks.AllSettled, "gathering", nil)
			return err
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			return run.Complete(ctx, run.Task.Input)
		},
	}
	fastRunner(t, b, handlers, nil)
	root, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	waitUntil(t, "the turn to complete", func() bool { return b.status(t, root.ID) == fsm.Completed })
	done, err := b.engine.Get(b.ctx, root.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"tools": 3}`, string(done.Result))
	require.Equal(t, 1, resumed, "the turn ran again once, after its children settled")
	b.requireClean(t)
}

func TestRunnerPanicIsAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fastRunner(t, b, map[string]machine.Handler{
		"boom": func(ctx context.Context, run *machine.Run) error { panic("kaboom") },
	}, nil)
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "boom"})
	require.NoError(t, err)
	waitUntil(t, "the task to fail", func() bool { return b.status(t, task.ID) == fsm.Failed })
	failed, err := b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, "panic", failed.Error.Code)
	require.Contains(t, failed.Error.Message, "kaboom")
	require.Contains(t, string(failed.Error.Detail), "stack")
	b.requireClean(t)
}

func TestRunnerErrorRetriesThenFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	attempts := 0
	fastRunner(t, b, map[string]machine.Handler{
		"flaky": func(ctx context.Context, run *machine.Run) error {
			mu.Lock()
			attempts++
			mu.Unlock()
			return errors.New("upstream 503")
		},
	}, nil)
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "flaky",
		MaxRetries: 2, RetryBackoffBase: 10 * time.Millisecond, RetryBackoffCap: 20 * time.Millisecond})
	require.NoError(t, err)
	waitUntil(t, "the task to fail", func() bool { return b.status(t, task.ID) == fsm.Failed })
	mu.Lock()
	require.Equal(t, 3, attempts, "one run and two retries")
	mu.Unlock()
	b.requireClean(t)
}

func TestRunnerOneGenerationAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var mu sync.Mutex
	var order []int64
	fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			mu.Lock()
			order = append(order, run.Task.ID)
			first := len(order) == 1
			mu.Unlock()
			if first {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
	}, nil)
	first, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	waitUntil(t, "the first turn to start", func() bool { return b.status(t, first.ID) == fsm.Running })
	second, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // several polls and the creation's notification
	require.Equal(t, fsm.Pending, b.status(t, second.ID), "a second turn waits while the first runs")
	close(release)
	waitUntil(t, "both turns to complete", func() bool { return b.status(t, second.ID) == fsm.Completed })
	require.Equal(t, []int64{first.ID, second.ID}, order)
	b.requireClean(t)
}

func TestRunnerAbortCancelsHandlerContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	stopped := make(chan error, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"block": func(ctx context.Context, run *machine.Run) error {
			close(started)
			<-ctx.Done()
			stopped <- context.Cause(ctx)
			return ctx.Err()
		},
	}, func(c *machine.RunnerConfig) { c.PollInterval = 10 * time.Second }) // the notification, not the poll, must do it
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "block"})
	require.NoError(t, err)
	// The creation's notification wakes the claim loop: no poll needed.
	<-started
	abortedAt := time.Now()
	_, err = b.engine.Abort(b.ctx, task.ID)
	require.NoError(t, err)
	cause := <-stopped
	t.Logf("abort → handler context cancelled: %s", time.Since(abortedAt))
	require.ErrorIs(t, cause, machine.ErrTaskStopped)
	require.Equal(t, fsm.Aborted, b.status(t, task.ID))
	b.requireClean(t)
}

func TestRunnerNeverClaimsUnknownKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fastRunner(t, b, map[string]machine.Handler{
		"known": func(ctx context.Context, run *machine.Run) error { return nil },
	}, func(c *machine.RunnerConfig) { c.UnknownKindGrace = 400 * time.Millisecond })
	unknown, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "from_the_next_deploy"})
	require.NoError(t, err)
	known, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv + "-2", Kind: "known"})
	require.NoError(t, err)
	waitUntil(t, "the known task to complete", func() bool { return b.status(t, known.ID) == fsm.Completed })
	require.Equal(t, fsm.Pending, b.status(t, unknown.ID), "not claimed, not failed within the grace period")
	waitUntil(t, "the unknown kind to fail past its grace", func() bool { return b.status(t, unknown.ID) == fsm.Failed })
	failed, err := b.engine.Get(b.ctx, unknown.ID)
	require.NoError(t, err)
	require.Equal(t, tasks.CodeUnknownKind, failed.Error.Code)
	require.Nil(t, failed.StartedAt, "it never ran")
	b.requireClean(t, b.conv+"-2")
}

func TestRunnerShutdownDrainsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	r, err := machine.NewRunner(b.engine, map[string]machine.Handler{
		"work": func(ctx context.Context, run *machine.Run) error {
			close(started)
			time.Sleep(300 * time.Millisecond)
			return run.Complete(ctx, nil)
		},
	}, &machine.RunnerConfig{LeaseDuration: time.Second, PollInterval: 50 * time.Millisecond, IdleRelease: time.Hour,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.Stop(b.ctx))
	require.Equal(t, fsm.Completed, b.status(t, task.ID), "the running handler was let finish")
	conv, err := b.engine.Store().GetConversation(b.ctx, b.pool, b.conv)
	require.NoError(t, err)
	require.Empty(t, conv.Owner, "the lease was released")
	require.Empty(t, r.Held())
	b.requireClean(t)
}

// TestTakenOverMachineCannotWrite simulates a paused machine: it holds the
// conversation and runs a task, then stops renewing past the lease's expiry;
// another node takes the conversation over. Every write the paused machine
// then tries is refused and changes nothing.
func TestTakenOverMachineCannotWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.engine.Store()
	root, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	_, _, err = b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)

	take := func(node string) (tasks.Fence, reconcile.Report) {
		var (
			fence tasks.Fence
			rep   reconcile.Report
		)
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			conv, err := st.TakeConversation(b.ctx, tx, b.conv, node, time.Minute)
			if err != nil {
				return err
			}
			fence = tasks.Fence{ConversationID: b.conv, Owner: node, Epoch: conv.Epoch}
			rep, err = reconcile.OnOpen(b.ctx, b.engine, tx, b.conv)
			return err
		}))
		return fence, rep
	}
	fenceA, _ := take("node-a")
	claimed, err := b.engine.ClaimRunnable(b.ctx, tasks.ClaimRunnableParams{Fence: fenceA, Kinds: []string{"turn"}, Roots: []int64{root.ID}, Limit: 10})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	run := claimed[0]

	// node-b cannot take a live lease.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := st.TakeConversation(b.ctx, tx, b.conv, "node-b", time.Minute)
		return err
	})
	require.ErrorIs(t, err, pgx.ErrNoRows, "no take-over while the lease is live")

	// node-a pauses past its lease; node-b takes over and recovers the run.
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.conversations SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.conv)
	require.NoError(t, err)
	fenceB, rep := take("node-b")
	require.Equal(t, fenceA.Epoch+1, fenceB.Epoch)
	require.Equal(t, []int64{run.ID}, rep.Requeued)

	before := snapshot(t, b)
	_, err = b.engine.ClaimRunnable(b.ctx, tasks.ClaimRunnableParams{Fence: fenceA, Kinds: []string{"turn"}, Roots: []int64{root.ID}, Limit: 10})
	require.ErrorIs(t, err, tasks.ErrLeaseLost)
	_, err = b.engine.Checkpoint(b.ctx, run.ID, run.Token, "zombie", nil)
	require.ErrorIs(t, err, tasks.ErrNotRunning)
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.ErrorIs(t, err, tasks.ErrNotRunning)
	_, err = b.engine.SleepUntil(b.ctx, run.ID, run.Token, time.Now().Add(time.Hour), "", nil)
	require.ErrorIs(t, err, tasks.ErrNotRunning)
	_, _, err = b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, OwnerID: run.ID, OwnerToken: run.Token, Kind: "child"})
	require.ErrorIs(t, err, tasks.ErrNotRunning)
	renewed, err := st.RenewConversations(b.ctx, b.pool, "node-a", []string{b.conv}, []int64{fenceA.Epoch}, time.Minute)
	require.NoError(t, err)
	require.Empty(t, renewed)
	released, err := st.ReleaseConversation(b.ctx, b.pool, b.conv, "node-a", fenceA.Epoch)
	require.NoError(t, err)
	require.False(t, released)
	require.Equal(t, before, snapshot(t, b), "the paused machine wrote nothing")

	// node-b runs the recovered task, with attempt 1, and its own token.
	again, err := b.engine.ClaimRunnable(b.ctx, tasks.ClaimRunnableParams{Fence: fenceB, Kinds: []string{"turn"}, Roots: []int64{root.ID}, Limit: 10})
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.Equal(t, 1, again[0].Attempt)
	require.NotEqual(t, run.Token, again[0].Token)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	b.requireClean(t)
}

func snapshot(t *testing.T, b *bundle) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT json_agg(t ORDER BY id)::text FROM `+b.schema+`.tasks t WHERE conversation_id = $1), '')
		|| (SELECT row_to_json(c)::text FROM `+b.schema+`.conversations c WHERE id = $1)`, b.conv).Scan(&s))
	return s
}

func TestRunnerWatchdogCancelsBlockedHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	engine, err := tasks.New(b.ctx, b.pool, &tasks.Config{Schema: b.schema, LeaseDuration: 150 * time.Millisecond})
	require.NoError(t, err)
	b.engine = engine
	stopped := make(chan error, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"stuck": func(ctx context.Context, run *machine.Run) error {
			<-ctx.Done() // never checkpoints, never heartbeats
			stopped <- context.Cause(ctx)
			return ctx.Err()
		},
	}, nil)
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "stuck"})
	require.NoError(t, err)
	require.ErrorIs(t, <-stopped, machine.ErrBlocked)
	waitUntil(t, "the blocked run to be failed", func() bool { return b.status(t, task.ID) == fsm.Failed })
	b.requireClean(t)
}

func TestRunnerStopCancelsAfterGraceAndIsRecovered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	causes := make(chan error, 1)
	r, err := machine.NewRunner(b.engine, map[string]machine.Handler{
		"long": func(ctx context.Context, run *machine.Run) error {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	}, &machine.RunnerConfig{LeaseDuration: time.Second, PollInterval: 50 * time.Millisecond, ShutdownGrace: 100 * time.Millisecond,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "long"})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.Stop(b.ctx))
	require.ErrorIs(t, <-causes, machine.ErrShutdown)
	conv, err := b.engine.Store().GetConversation(b.ctx, b.pool, b.conv)
	require.NoError(t, err)
	require.Empty(t, conv.Owner, "released")

	// The next runner recovers the cut run at once: the lease was released.
	done := make(chan int, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"long": func(ctx context.Context, run *machine.Run) error {
			done <- run.Task.Attempt
			return nil
		},
	}, nil)
	require.Equal(t, 1, <-done, "recovered with attempt + 1")
	waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == fsm.Completed })
	b.requireClean(t)
}
