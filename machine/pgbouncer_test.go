package machine_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// bouncerTree is the handlers of a turn that needs every path of the
// runner: it spawns a tool, a nap (a sleep, woken by River's wake job) and
// an approval (an event awaited), waits for all three, and completes with
// what they returned.
func bouncerTree(parked chan<- int64) map[string]machine.Handler {
	return map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				results, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				parts := make([]string, len(results))
				for i, r := range results {
					parts[i] = r.Kind + "=" + string(r.Result)
				}
				out, _ := json.Marshal(strings.Join(parts, " "))
				return run.Complete(ctx, out)
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "tool"}, {Kind: "nap"}, {Kind: "approval"}})
			if err != nil {
				return err
			}
			ids := []int64{kids[0].ID, kids[1].ID, kids[2].ID}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "gathering"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"ran"`)) },
		"nap": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "woke" {
				return run.Complete(ctx, []byte(`"slept"`))
			}
			return run.SleepUntil(ctx, time.Now().Add(100*time.Millisecond), "woke", nil)
		},
		"approval": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "decided" {
				return run.Complete(ctx, run.Task.Delivered.Payload)
			}
			parked <- run.Task.ID
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approve", Phase: "decided"})
		},
	}
}

// bouncerBundle is an engine whose pool goes through PgBouncer in
// transaction mode, on a schema of the test's own.
type bouncerBundle struct {
	*bundle
	bounced *enginetest.Engine
	// appBounced and appListen are the application_name of the
	// connections through PgBouncer and of the ListenPool's.
	appBounced, appListen string
}

// setupBouncer returns an engine through PgBouncer on a schema of the
// test's own, with a direct pool as its ListenPool when asked, logging to
// logger.
func setupBouncer(t *testing.T, withListenPool bool, logger *slog.Logger) *bouncerBundle {
	t.Helper()
	bb := &bouncerBundle{appBounced: testdb.Name("bounced"), appListen: testdb.Name("listen")}
	bounced := testdb.PgBouncerPool(t, bb.appBounced)
	bb.bundle = setup(t)
	cfg := &tasks.Config{Schema: bb.schema, TransactionPooler: true, Logger: logger}
	if withListenPool {
		cfg.ListenPool = testdb.NamedPool(t, bb.appListen)
	}
	bb.bounced = enginetest.New(t, bounced, cfg)
	return bb
}

// listens counts the server sessions of application appName whose last
// statement was a LISTEN: the connections that are listening. (A server
// session PgBouncer hands out runs the statements of many clients in
// turn, so one that LISTENed through it shows so only until its next
// transaction: the check is made while the listeners run.)
func (b *bouncerBundle) listens(t *testing.T, appName string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, appName)
}

// TestRunnerThroughPgBouncer runs a runner whose engine goes through
// PgBouncer in transaction mode, with a direct ListenPool: a tree with a
// wait, a sleep woken by River's job (River poll-only through the pooler)
// and an awaited event completes; Follow hears every entry of it and
// AwaitSettled returns its settle; the LISTENs are on the direct
// connections, none through PgBouncer; the invariant checker finds
// nothing.
func TestRunnerThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := setupBouncer(t, true, nil)
	eng := b.bounced
	parked := make(chan int64, 1)
	wakes := make(chan machine.Wake, 4)
	r, err := machine.NewRunner(eng.Engine, bouncerTree(parked), &machine.RunnerConfig{
		ConversationLease: 2 * time.Second,
		PollInterval:      time.Second,
		ShutdownGrace:     5 * time.Second,
		Waker: &machine.WakerConfig{DisableTimers: true, RiverTestOnly: true,
			OnWake: func(ev machine.Wake) { wakes <- ev }},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})

	turn, _, err := eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)

	// A follower from the start of the conversation (once it exists: Follow
	// of an unknown conversation is ErrNotFound), through the engine behind
	// PgBouncer (its LISTEN on the ListenPool).
	fctx, stopFollow := context.WithCancel(b.ctx)
	var followed []arbortype.LogEntry
	var followMu sync.Mutex
	followDone := make(chan error, 1)
	go func() {
		followDone <- eng.Follow(fctx, b.conv, 0, func(en arbortype.LogEntry) error {
			followMu.Lock()
			defer followMu.Unlock()
			followed = append(followed, en)
			return nil
		})
	}()

	approval := <-parked
	waitUntil(t, "the approval to park", func() bool {
		p, err := eng.PendingEvents(b.ctx, b.conv)
		require.NoError(t, err)
		return len(p) == 1
	})
	require.NotZero(t, b.listens(t, b.appListen), "the runner, the waker and the follower LISTEN on the ListenPool")
	require.Zero(t, b.listens(t, b.appBounced), "nothing LISTENs through PgBouncer")

	_, created, err := eng.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: approval, Name: "approve", Payload: json.RawMessage(`"granted"`)})
	require.NoError(t, err)
	require.True(t, created)

	ctx, cancel := context.WithTimeout(b.ctx, eventually)
	defer cancel()
	done, err := eng.AwaitSettled(ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, done.Status)
	require.JSONEq(t, `"tool=\"ran\" nap=\"slept\" approval=\"granted\""`, string(done.Result))
	ev := <-wakes
	require.Equal(t, machine.WokenByRiver, ev.By, "the sleep was woken by River's wake job, through PgBouncer")

	// The follower hears everything up to the turn's settle, in order.
	waitUntil(t, "the follower to hear the turn settle", func() bool {
		select {
		case err := <-followDone:
			require.Failf(t, "the follower ended early", "%v", err)
		default:
		}
		followMu.Lock()
		defer followMu.Unlock()
		for _, en := range followed {
			if en.TaskID == turn.ID && en.Terminal() {
				return true
			}
		}
		return false
	})
	stopFollow()
	require.ErrorIs(t, <-followDone, context.Canceled)
	all, err := eng.ReadLog(b.ctx, b.conv, 0, 10000)
	require.NoError(t, err)
	followMu.Lock()
	require.Equal(t, all[:len(followed)], followed, "the follower saw the log as it is, in order")
	followMu.Unlock()
	require.Zero(t, b.listens(t, b.appBounced), "nothing LISTENs through PgBouncer")
	b.requireClean(t)
}

// TestPgBouncerWithoutListenPool: behind PgBouncer with no ListenPool,
// nothing LISTENs (a LISTEN through a transaction-mode pooler hears
// nothing) and New says so; the runner, the waker's timers and
// AwaitSettled find their news by polling, and the same tree completes.
func TestPgBouncerWithoutListenPool(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	b := setupBouncer(t, false, slog.New(logs))
	require.True(t, logs.count("no Config.ListenPool") > 0, "New warns that nothing will LISTEN")
	eng := b.bounced
	parked := make(chan int64, 1)
	r, err := machine.NewRunner(eng.Engine, bouncerTree(parked), &machine.RunnerConfig{
		ConversationLease: 2 * time.Second,
		PollInterval:      50 * time.Millisecond,
		ShutdownGrace:     5 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true, PollInterval: 50 * time.Millisecond},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	turn, _, err := eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	approval := <-parked
	waitUntil(t, "the approval to park", func() bool {
		p, err := eng.PendingEvents(b.ctx, b.conv)
		require.NoError(t, err)
		return len(p) == 1
	})
	_, _, err = eng.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: approval, Name: "approve", Payload: json.RawMessage(`"granted"`)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, eventually)
	defer cancel()
	done, err := eng.AwaitSettled(ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, done.Status)
	require.JSONEq(t, `"tool=\"ran\" nap=\"slept\" approval=\"granted\""`, string(done.Result))
	require.Zero(t, b.listens(t, b.appBounced), "nothing LISTENs through PgBouncer")
	b.requireClean(t)
}

// TestPgBouncerWarnsOfThePreparedStatementCache: an engine told it is
// behind a transaction-mode pooler, on a pool that keeps pgx's default
// prepared-statement cache, says what to set.
func TestPgBouncerWarnsOfThePreparedStatementCache(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	logs := &logRecorder{}
	_, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema, TransactionPooler: true,
		ListenPool: pool, Logger: slog.New(logs)})
	require.NoError(t, err)
	require.True(t, logs.count("QueryExecModeExec") > 0, "New names the setting")
	require.False(t, logs.count("no Config.ListenPool") > 0, "with a ListenPool, no warning about polling")
}
