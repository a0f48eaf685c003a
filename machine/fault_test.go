package machine_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// faultBundle is an engine whose connections go through a fault proxy.
type faultBundle struct {
	*bundle
	proxy *testdb.Proxy
	eng   *tasks.Engine // through the proxy
}

func setupFaults(t *testing.T, unavailable time.Duration) *faultBundle {
	t.Helper()
	b := setup(t)
	proxy, url := testdb.StartProxy(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema, UnavailableTimeout: unavailable})
	require.NoError(t, err)
	return &faultBundle{bundle: b, proxy: proxy, eng: eng}
}

// TestTransientFaultsAreRetried: every connection of the pool is cut
// between operations (a failover, a proxy restart): the next operation
// finds its pooled connection dead and runs again on a new one, invisibly.
// And the database unreachable for a while only delays an operation.
func TestTransientFaultsAreRetried(t *testing.T) {
	t.Parallel()
	f := setupFaults(t, time.Minute)
	turn, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, Kind: "turn"})
	require.NoError(t, err)
	for range 3 {
		f.proxy.CutAll()
		_, err := f.eng.Get(f.ctx, turn.ID)
		require.NoError(t, err, "a read on a cut connection is retried")
		f.proxy.CutAll()
		_, _, err = f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, OwnerID: turn.ID, Kind: "tool"})
		require.NoError(t, err, "a write on a cut connection is retried")
	}

	// Down, and up again once the operation is seen retrying (its
	// connection attempts refused): it succeeds.
	f.proxy.Down()
	refused := f.proxy.Refused()
	done := make(chan error, 1)
	go func() {
		_, err := f.eng.Cancel(f.ctx, turn.ID, nil)
		done <- err
	}()
	waitUntil(t, "the cancel to retry", func() bool { return f.proxy.Refused() >= refused+2 })
	select {
	case err := <-done:
		t.Fatalf("cancel finished while the database was unreachable: %v", err)
	default:
	}
	f.proxy.Up()
	require.NoError(t, <-done)
	require.Equal(t, arbortype.StatusCancelled, f.status(t, turn.ID))
	require.Len(t, mustChildren(t, f.bundle, turn.ID), 3, "each create landed once")
}

func mustChildren(t *testing.T, b *bundle, id int64) []arbortype.Task {
	t.Helper()
	kids, err := b.engine.Children(b.ctx, id)
	require.NoError(t, err)
	return kids
}

// TestUnavailableDatabase: past Config.UnavailableTimeout every public
// operation says ErrUnavailable, and nothing is written.
func TestUnavailableDatabase(t *testing.T) {
	t.Parallel()
	f := setupFaults(t, 100*time.Millisecond)
	turn, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(f.ctx, f.eng, f.conv, &machine.LeaseConfig{Holder: "faulty"})
	require.NoError(t, err)
	run, err := lease.Start(f.ctx, turn.ID)
	require.NoError(t, err)
	before := snapshot(t, f.bundle)

	f.proxy.Down()
	ops := map[string]func() error{
		"Create": func() error {
			_, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, Kind: "turn"})
			return err
		},
		"Get":               func() error { _, err := f.eng.Get(f.ctx, turn.ID); return err },
		"GetMany":           func() error { _, err := f.eng.GetMany(f.ctx, []int64{turn.ID}); return err },
		"Children":          func() error { _, err := f.eng.Children(f.ctx, turn.ID); return err },
		"ConversationTasks": func() error { _, err := f.eng.ConversationTasks(f.ctx, f.conv); return err },
		"Conversation":      func() error { _, err := f.eng.Conversation(f.ctx, f.conv); return err },
		"ListConversations": func() error { _, err := f.eng.ListConversations(f.ctx, tasks.ListParams{}); return err },
		"Cancel":            func() error { _, err := f.eng.Cancel(f.ctx, turn.ID, nil); return err },
		"Abort":             func() error { _, err := f.eng.Abort(f.ctx, turn.ID); return err },
		"AbortConversation": func() error { _, err := f.eng.AbortConversation(f.ctx, f.conv); return err },
		"WakeNow":           func() error { _, err := f.eng.WakeNow(f.ctx, turn.ID); return err },
		"Check":             func() error { _, err := f.eng.Check(f.ctx, f.conv); return err },
		"AcquireLease": func() error {
			_, err := machine.AcquireLease(f.ctx, f.eng, f.conv, nil)
			return err
		},
		"Lease.Start":    func() error { _, err := lease.Start(f.ctx, turn.ID); return err },
		"Lease.Claim":    func() error { _, err := lease.Claim(f.ctx, 1); return err },
		"Lease.Renew":    func() error { return lease.Renew(f.ctx) },
		"Lease.Release":  func() error { return lease.Release(f.ctx) },
		"Run.Checkpoint": func() error { return run.Checkpoint(f.ctx, "p", nil) },
		"Run.Heartbeat":  func() error { return run.Heartbeat(f.ctx) },
		"Run.Spawn": func() error {
			_, err := run.Spawn(f.ctx, machine.SpawnParams{Kind: "tool"})
			return err
		},
		"Run.Children":   func() error { _, err := run.Children(f.ctx); return err },
		"Run.Wait":       func() error { return run.Wait(f.ctx, machine.WaitParams{Policy: arbortype.AllSettled}) },
		"Run.SleepUntil": func() error { return run.SleepUntil(f.ctx, time.Now().Add(time.Hour), "", nil) },
		"Run.Complete":   func() error { return run.Complete(f.ctx, nil) },
	}
	for name, op := range ops {
		err := op()
		require.ErrorIs(t, err, arbortype.ErrUnavailable, "%s: %v", name, err)
	}
	f.proxy.Up()
	require.Equal(t, before, snapshot(t, f.bundle), "nothing was written")
	require.False(t, run.Ended(), "an unavailable database ends no run")
	require.NoError(t, run.Complete(f.ctx, []byte(`"after the outage"`)))
	require.NoError(t, lease.Release(f.ctx))
	f.requireClean(t)
}

// TestAmbiguousCommit: a connection lost while COMMIT is in flight, with
// the COMMIT reaching the server (it committed) and not (it did not). The
// user's operation says ErrAmbiguous either way; a run resolves it by
// reading its task back.
func TestAmbiguousCommit(t *testing.T) {
	t.Parallel()
	f := setupFaults(t, time.Minute)
	turn, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, Kind: "turn"})
	require.NoError(t, err)

	for _, fault := range []testdb.CommitFault{testdb.CutAfterCommit, testdb.CutBeforeCommit} {
		f.proxy.OnNextCommit(fault)
		key := map[testdb.CommitFault]string{testdb.CutAfterCommit: "landed", testdb.CutBeforeCommit: "lost"}[fault]
		_, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, OwnerID: turn.ID, Kind: "tool", IdempotencyKey: key})
		require.ErrorIs(t, err, arbortype.ErrAmbiguous)
		// The idempotency key makes the retry safe either way.
		again, created, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, OwnerID: turn.ID, Kind: "tool", IdempotencyKey: key})
		require.NoError(t, err)
		require.Equal(t, fault == testdb.CutBeforeCommit, created, "the first create committed iff its COMMIT reached the server")
		require.Equal(t, key, again.IdempotencyKey)
	}

	// A run's ending write: resolved by reading the task back, whether it
	// landed or not; a spawn, written again under its key.
	lease, err := machine.AcquireLease(f.ctx, f.eng, f.conv, nil)
	require.NoError(t, err)
	for _, fault := range []testdb.CommitFault{testdb.CutAfterCommit, testdb.CutBeforeCommit} {
		task, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, OwnerID: turn.ID, Kind: "tool"})
		require.NoError(t, err)
		run, err := lease.Start(f.ctx, task.ID)
		require.NoError(t, err)
		f.proxy.OnNextCommit(fault)
		child, err := run.Spawn(f.ctx, machine.SpawnParams{Kind: "leaf"})
		require.NoError(t, err, "a spawn whose commit was lost is written again")
		kids := mustChildren(t, f.bundle, task.ID)
		require.Len(t, kids, 1, "once, whether or not the first commit landed")
		require.Equal(t, child.ID, kids[0].ID)
		_, err = f.eng.Cancel(f.ctx, child.ID, nil)
		require.NoError(t, err)
		f.proxy.OnNextCommit(fault)
		require.NoError(t, run.Complete(f.ctx, []byte(`"done"`)), "resolved by reading the task back")
		require.True(t, run.Ended())
		done, err := f.eng.Get(f.ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusCompleted, done.Status)
		require.JSONEq(t, `"done"`, string(done.Result))
	}
	require.NoError(t, lease.Release(f.ctx))
	_, err = f.eng.AbortConversation(f.ctx, f.conv)
	require.NoError(t, err)
	f.requireClean(t)
}

// TestRunnerRidesOutAnOutage: handlers whose writes meet an unavailable
// database (past the engine's retry budget) lose nothing and fail nothing
// (docs/design.md §3.8, "The ending"):
//   - a Complete cut off is written again by the runner once the database
//     is back, from the result the handler sent: the handler is not called
//     again, whatever its kind;
//   - a handler that returned the fault of a checkpoint (before its end) is
//     called again with the same run — unless its task is abandon_on_restart,
//     which is entered once, whatever happened: it is abandoned, as a crash
//     would have it.
func TestRunnerRidesOutAnOutage(t *testing.T) {
	t.Parallel()
	f := setupFaults(t, 50*time.Millisecond)
	var (
		mu     sync.Mutex
		calls  = map[int64]int{}
		failed = map[int64]error{}
	)
	entered := make(chan struct{}, 16)
	gate := make(chan struct{})
	// first reports whether this is the task's first call, counting it.
	first := func(run *machine.Run) bool {
		mu.Lock()
		defer mu.Unlock()
		calls[run.Task.ID]++
		return calls[run.Task.ID] == 1
	}
	noted := func(run *machine.Run, err error) error {
		if err != nil {
			mu.Lock()
			failed[run.Task.ID] = err
			mu.Unlock()
		}
		return err
	}
	complete := func(ctx context.Context, run *machine.Run) error {
		if first(run) {
			entered <- struct{}{}
			<-gate // the database goes down meanwhile
		}
		return noted(run, run.Complete(ctx, []byte(`"answered"`)))
	}
	checkpoint := func(ctx context.Context, run *machine.Run) error {
		if first(run) {
			entered <- struct{}{}
			<-gate
			return noted(run, run.Checkpoint(ctx, "midway", nil))
		}
		return run.Complete(ctx, []byte(`"answered"`))
	}
	r, err := machine.NewRunner(f.eng, map[string]machine.Handler{"complete": complete, "checkpoint": checkpoint},
		&machine.RunnerConfig{ConversationLease: time.Minute, PollInterval: 50 * time.Millisecond,
			Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(f.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	type turn struct {
		id      int64
		conv    string
		kind    string
		abandon bool
	}
	var turns []turn
	for i, c := range []struct {
		kind    string
		abandon bool
	}{{"complete", false}, {"complete", true}, {"checkpoint", false}, {"checkpoint", true}} {
		conv := fmt.Sprintf("%s-%d", f.conv, i)
		task, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: conv, Kind: c.kind, AbandonOnRestart: c.abandon})
		require.NoError(t, err)
		turns = append(turns, turn{task.ID, conv, c.kind, c.abandon})
	}
	for range turns {
		<-entered
	}
	f.proxy.Down()
	close(gate) // every write now fails past the 50 ms budget
	waitUntil(t, "every handler's write to give up", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failed) == len(turns)
	})
	mu.Lock()
	for _, err := range failed {
		require.ErrorIs(t, err, arbortype.ErrUnavailable)
	}
	mu.Unlock()
	f.proxy.Up()
	for _, tu := range turns {
		if tu.kind == "checkpoint" && tu.abandon {
			waitUntil(t, "the abandon_on_restart turn to be abandoned", func() bool { return f.status(t, tu.id) == arbortype.StatusCancelled })
			got := f.get(t, tu.id)
			require.NotNil(t, got.Error)
			require.Equal(t, arbortype.CodeAbandonedOnRestart, got.Error.Code)
			require.Equal(t, 0, got.Attempt, "the outage was not a recovery")
		} else {
			waitUntil(t, "the turn to complete", func() bool { return f.status(t, tu.id) == arbortype.StatusCompleted })
			got := f.get(t, tu.id)
			require.JSONEq(t, `"answered"`, string(got.Result))
			require.Equal(t, 0, got.Attempt, "the outage was not a recovery")
			require.Empty(t, got.ErrorHistory, "no failure recorded")
		}
	}
	mu.Lock()
	for _, tu := range turns {
		want := 1 // the cut-off Complete written again by the runner; abandon_on_restart entered once
		if tu.kind == "checkpoint" && !tu.abandon {
			want = 2 // called again once the database was back, with the same run
		}
		require.Equal(t, want, calls[tu.id], "calls of the %s handler (abandon_on_restart %v)", tu.kind, tu.abandon)
	}
	mu.Unlock()
	for _, tu := range turns {
		f.requireClean(t, tu.conv)
	}
}

// TestSlowReconnectIsReported: every connection of a runner is cut and new
// ones hang (the route blackholed: a failover, a server too busy to fork).
// The renewer's wait for a new connection outlasts a quarter of the lease,
// and the runner says so — the operator's sign that a reconnect a little
// slower fires the fence — and, once the route heals, the turn completes.
func TestSlowReconnectIsReported(t *testing.T) {
	t.Parallel()
	f := setupFaults(t, time.Minute)
	logs := &logRecorder{}
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	r, err := machine.NewRunner(f.eng, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-gate // the fence may stop this call: the run is then requeued
			return run.Complete(ctx, []byte(`"answered"`))
		},
	}, &machine.RunnerConfig{ConversationLease: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(logs), Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(f.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	turn, _, err := f.eng.Create(f.ctx, arbortype.CreateParams{ConversationID: f.conv, Kind: "turn"})
	require.NoError(t, err)
	<-entered
	const warning = "lease renewal waited long for a database connection"
	require.Zero(t, logs.count(warning), "no slow connection before the fault")
	f.proxy.Blackhole()
	f.proxy.CutAll()
	waitUntil(t, "the runner to report its slow reconnect", func() bool { return logs.count(warning) > 0 })
	f.proxy.Heal()
	close(gate)
	waitUntil(t, "the turn to complete", func() bool { return f.status(t, turn.ID) == arbortype.StatusCompleted })
	require.Equal(t, 1, logs.count(warning), "reported once a minute at most")
}
