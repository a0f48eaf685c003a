package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// fastRunner is a runner configured for tests: short leases and polls.
func fastRunner(t *testing.T, b *bundle, handlers map[string]machine.Handler, tweak func(*machine.RunnerConfig)) *machine.Runner {
	t.Helper()
	cfg := &machine.RunnerConfig{
		ConversationLease: 3 * time.Second, // renewals each 500 ms: a starved CPU does not fire the fence by itself
		PollInterval:      50 * time.Millisecond,
		IdleRelease:       200 * time.Millisecond,
		ShutdownGrace:     2 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true},
	}
	if tweak != nil {
		tweak(cfg)
	}
	r, err := machine.NewRunner(b.engine.Engine, handlers, cfg)
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
		if _, err := b.engine.Conversation(b.ctx, c); c == b.conv && errors.Is(err, arbortype.ErrNotFound) {
			continue // the test used conversations of its own only
		}
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
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "gathering"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			return run.Complete(ctx, run.Task.Input)
		},
	}
	fastRunner(t, b, handlers, nil)
	root, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	waitUntil(t, "the turn to complete", func() bool { return b.status(t, root.ID) == arbortype.StatusCompleted })
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
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "boom"})
	require.NoError(t, err)
	waitUntil(t, "the task to fail", func() bool { return b.status(t, task.ID) == arbortype.StatusFailed })
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
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "flaky",
		MaxRetries: 2, RetryBackoffBase: 10 * time.Millisecond, RetryBackoffCap: 20 * time.Millisecond})
	require.NoError(t, err)
	waitUntil(t, "the task to fail", func() bool { return b.status(t, task.ID) == arbortype.StatusFailed })
	mu.Lock()
	require.Equal(t, 3, attempts, "one run and two retries")
	mu.Unlock()
	b.requireClean(t)
}

func TestRunnerOneGenerationAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	probed := make(chan struct{})
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
		// A root that is not a generation runs beside the turns: when it
		// has run, the machine has claimed since the second turn was
		// created, and left that turn alone.
		"probe": func(ctx context.Context, run *machine.Run) error {
			close(probed)
			return nil
		},
	}, func(c *machine.RunnerConfig) { c.GenerationKinds = []string{"turn"} })
	first, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	waitUntil(t, "the first turn to start", func() bool { return b.status(t, first.ID) == arbortype.StatusRunning })
	second, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "probe"})
	require.NoError(t, err)
	<-probed
	require.Equal(t, arbortype.StatusPending, b.status(t, second.ID), "a second turn waits while the first runs")
	close(release)
	waitUntil(t, "both turns to complete", func() bool { return b.status(t, second.ID) == arbortype.StatusCompleted })
	// The first turn may have been called more than once: a starved CPU
	// (a loaded CI run) can fire the fence, which stops its run, and the
	// reopen runs it again. The second turn must still come after it.
	mu.Lock()
	require.Equal(t, []int64{first.ID, second.ID}, slices.Compact(slices.Clone(order)), "calls in order: %v", order)
	mu.Unlock()
	b.requireClean(t)
}

func TestRunnerAbortCancelsHandlerContext(t *testing.T) {
	t.Parallel()
	// A round in which the node's fence stopped the handler first (a
	// renewer starved past the fence point, beside a second test suite)
	// says nothing about the abort: it is run again, up to three times.
	for round := 1; ; round++ {
		if abortCancelsHandler(t) {
			return
		}
		require.Less(t, round, 3, "the node's fence stopped the handler in every round")
		t.Logf("round %d: the node's fence stopped the handler before the abort; again", round)
	}
}

// abortCancelsHandler runs one round of TestRunnerAbortCancelsHandlerContext;
// false when the node's fence cancelled the handler before the abort did.
func abortCancelsHandler(t *testing.T) bool {
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
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "block"})
	require.NoError(t, err)
	// The creation's notification wakes the claim loop: no poll needed.
	<-started
	abortedAt := time.Now()
	_, err = b.engine.Abort(b.ctx, task.ID)
	require.NoError(t, err)
	cause := <-stopped
	if errors.Is(cause, arbortype.ErrLeaseLost) {
		return false
	}
	t.Logf("abort → handler context cancelled: %s", time.Since(abortedAt))
	require.ErrorIs(t, cause, machine.ErrTaskStopped)
	require.Equal(t, arbortype.StatusAborted, b.status(t, task.ID))
	b.requireClean(t)
	return true
}

func TestRunnerNeverClaimsUnknownKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fastRunner(t, b, map[string]machine.Handler{
		"known": func(ctx context.Context, run *machine.Run) error { return nil },
	}, func(c *machine.RunnerConfig) { c.UnknownKindGrace = 400 * time.Millisecond })
	unknown, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "from_the_next_deploy"})
	require.NoError(t, err)
	known, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-2", Kind: "known"})
	require.NoError(t, err)
	waitUntil(t, "the known task to complete", func() bool { return b.status(t, known.ID) == arbortype.StatusCompleted })
	// Whether the unknown task is still pending here depends on how fast a
	// busy machine got here; what must hold is read from the database's
	// own clock: it never ran, and it failed only past its grace.
	waitUntil(t, "the unknown kind to fail past its grace", func() bool { return b.status(t, unknown.ID) == arbortype.StatusFailed })
	failed, err := b.engine.Get(b.ctx, unknown.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.CodeUnknownKind, failed.Error.Code)
	require.Nil(t, failed.StartedAt, "it never ran")
	require.NotNil(t, failed.SettledAt)
	require.GreaterOrEqual(t, failed.SettledAt.Sub(failed.CreatedAt), 400*time.Millisecond,
		"not failed within the grace period (by the database's clock)")
	b.requireClean(t, b.conv+"-2")
}

func TestRunnerShutdownDrainsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	r, err := machine.NewRunner(b.engine.Engine, map[string]machine.Handler{
		"work": func(ctx context.Context, run *machine.Run) error {
			close(started)
			time.Sleep(300 * time.Millisecond)
			return run.Complete(ctx, nil)
		},
	}, &machine.RunnerConfig{ConversationLease: 3 * time.Second, PollInterval: 50 * time.Millisecond, IdleRelease: time.Hour,
		Waker: &machine.WakerConfig{RiverTestOnly: true}}) // 3 s: the fence, fired by a starved renewer, would stop the handler this test lets finish
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.Stop(b.ctx))
	require.Equal(t, arbortype.StatusCompleted, b.status(t, task.ID), "the running handler was let finish")
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, conv.Holder, "the lease was released")
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
	root, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)

	leaseA, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Holder: "node-a", Duration: time.Minute})
	require.NoError(t, err)
	runs, err := leaseA.Claim(b.ctx, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1, "one generation at a time: the oldest turn")
	run := runs[0]
	require.Equal(t, root.ID, run.Task.ID)

	// node-b cannot take a live lease.
	_, err = machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Holder: "node-b"})
	require.ErrorIs(t, err, arbortype.ErrLeaseHeld, "no take-over while the lease is live")

	// node-a pauses past its lease; node-b takes over and recovers the run.
	// (The holders' guard refuses a deadline brought back: the test
	// writes it with the triggers off, a superuser's replica role.)
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `UPDATE `+b.schema+`.holders SET expires_at = now() - interval '1 second'
			WHERE id = (SELECT holder_id FROM `+b.schema+`.conversations WHERE id = $1)`, b.conv)
		return err
	})
	require.NoError(t, err)
	leaseB, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Holder: "node-b", Duration: time.Minute})
	require.NoError(t, err)
	require.Equal(t, leaseA.Epoch()+1, leaseB.Epoch())
	require.Equal(t, []int64{run.Task.ID}, leaseB.Report().Requeued)

	before := snapshot(t, b)
	_, err = leaseA.Claim(b.ctx, 10)
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	_, err = leaseA.Start(b.ctx, root.ID)
	require.ErrorIs(t, err, arbortype.ErrLeaseLost)
	require.ErrorIs(t, run.Checkpoint(b.ctx, "zombie", nil), arbortype.ErrNotRunning)
	_, err = run.Spawn(b.ctx, machine.SpawnParams{Kind: "child"})
	require.ErrorIs(t, err, arbortype.ErrNotRunning)
	require.ErrorIs(t, run.SleepUntil(b.ctx, time.Now().Add(time.Hour), "", nil), arbortype.ErrNotRunning)
	require.ErrorIs(t, run.Wait(b.ctx, machine.WaitParams{Policy: arbortype.AllSettled}), arbortype.ErrNotRunning)
	require.ErrorIs(t, run.Complete(b.ctx, nil), arbortype.ErrNotRunning)
	require.ErrorIs(t, leaseA.Renew(b.ctx), arbortype.ErrLeaseLost)
	require.ErrorIs(t, leaseA.Release(b.ctx), arbortype.ErrLeaseLost)
	require.Equal(t, before, snapshot(t, b), "the paused machine wrote nothing")

	// node-b runs the recovered task, with attempt 1, and its own token.
	again, err := leaseB.Claim(b.ctx, 10)
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.Equal(t, 1, again[0].Task.Attempt)
	require.NotEqual(t, run.Task.Token, again[0].Task.Token)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.NoError(t, leaseB.Release(b.ctx))
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
	// A round in which the node's fence stopped the handler first (a
	// renewer starved past the fence point: beside a second test suite, a
	// 3 s lease's fence came before the watchdog's 300 ms) says nothing
	// about the watchdog: it is run again, up to three times.
	for round := 1; ; round++ {
		if watchdogCancelsBlocked(t) {
			return
		}
		require.Less(t, round, 3, "the node's fence stopped the handler in every round")
		t.Logf("round %d: the node's fence stopped the handler before the watchdog; again", round)
	}
}

// watchdogCancelsBlocked runs one round of
// TestRunnerWatchdogCancelsBlockedHandler; false when the node's fence
// cancelled the handler before the watchdog did.
func watchdogCancelsBlocked(t *testing.T) bool {
	b := setup(t)
	b.engine = enginetest.New(t, b.pool, &tasks.Config{Schema: b.schema, TaskLease: 150 * time.Millisecond})
	stopped := make(chan error, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"stuck": func(ctx context.Context, run *machine.Run) error {
			<-ctx.Done() // never checkpoints, never heartbeats
			stopped <- context.Cause(ctx)
			return ctx.Err()
		},
	}, func(c *machine.RunnerConfig) { c.BlockedAfter = 300 * time.Millisecond })
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "stuck"})
	require.NoError(t, err)
	cause := <-stopped
	if errors.Is(cause, arbortype.ErrLeaseLost) {
		return false
	}
	require.ErrorIs(t, cause, machine.ErrBlocked)
	waitUntil(t, "the blocked run to be failed", func() bool { return b.status(t, task.ID) == arbortype.StatusFailed })
	b.requireClean(t)
	return true
}

func TestRunnerStopCancelsAfterGraceAndIsRecovered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{})
	causes := make(chan error, 1)
	r, err := machine.NewRunner(b.engine.Engine, map[string]machine.Handler{
		"long": func(ctx context.Context, run *machine.Run) error {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	}, &machine.RunnerConfig{ConversationLease: time.Minute, PollInterval: 50 * time.Millisecond, ShutdownGrace: 100 * time.Millisecond,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "long"})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.Stop(b.ctx))
	require.ErrorIs(t, <-causes, machine.ErrShutdown)
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, conv.Holder, "released")

	// The next runner recovers the cut run at once: the lease was released.
	done := make(chan int, 1)
	fastRunner(t, b, map[string]machine.Handler{
		"long": func(ctx context.Context, run *machine.Run) error {
			done <- run.Task.Attempt
			return nil
		},
	}, nil)
	require.Equal(t, 0, <-done, "recovered, and not counted as a restart: the runner stopped it itself")
	waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == arbortype.StatusCompleted })
	b.requireClean(t)
}
