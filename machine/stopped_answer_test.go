package machine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// holdTaskRow locks task id's row in a transaction of the test's own, so
// that a write of the task waits for it; release ends that transaction.
// blocked reports whether another backend waits for the lock now.
func holdTaskRow(t *testing.T, b *bundle, id int64) (blocked func() bool, release func()) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(b.ctx, fmt.Sprintf("SELECT 1 FROM %s.tasks WHERE id = $1 FOR UPDATE", pgx.Identifier{b.schema}.Sanitize()), id)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, tx.Rollback(b.ctx))
		}
	}
	t.Cleanup(release)
	blocked = func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))", pid).Scan(&n))
		return n > 0
	}
	return blocked, release
}

// requireTruth asserts what the caller of a write whose context was
// cancelled while the write was committing heard (docs/design.md §3.8,
// "The answer to a stopped caller"): the write landed, so its caller is told
// nil, or ErrAmbiguous when its answer was not in — never a refusal.
func requireTruth(t *testing.T, b *bundle, id int64, err error) {
	t.Helper()
	// ErrAmbiguous: the write goes on to its end; the caller finds out by
	// reading the task, once it has left running.
	waitUntil(t, "the write to end", func() bool { return b.get(t, id).Status != arbortype.StatusRunning })
	got, gerr := b.engine.Get(b.ctx, id)
	require.NoError(t, gerr)
	require.Equal(t, arbortype.StatusCompleted, got.Status, "the write landed")
	require.JSONEq(t, `"done"`, string(got.Result))
	require.True(t, err == nil || errors.Is(err, arbortype.ErrAmbiguous),
		"a write that landed is reported as nil or ErrAmbiguous, never refused; got %v", err)
}

// TestStoppedRunnerCallerHearsTheTruth: a handler's Complete is in a flush
// (waiting for the task's row, which the test holds) when its context is
// cancelled by Stop: the flush commits, and the handler is told so (issue
// 38: frozen past its lease, a runner's Complete returned ErrLeaseLost
// while the batched write still landed).
func TestStoppedRunnerCallerHearsTheTruth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	entered, held, cancelled := make(chan struct{}), make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	r, err := machine.NewRunner(b.engine.Engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			close(entered)
			<-held
			go func() { <-ctx.Done(); close(cancelled) }()
			err := run.Complete(ctx, []byte(`"done"`))
			result <- err
			return err
		},
	}, &machine.RunnerConfig{ShutdownGrace: 50 * time.Millisecond, PollInterval: time.Minute,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	<-entered
	blocked, release := holdTaskRow(t, b, turn.ID)
	close(held)
	waitUntil(t, "the flush to wait for the task's row", blocked)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(b.ctx) }()
	<-cancelled // the handler's context is cancelled while its write waits
	release()
	err = <-result
	require.NoError(t, <-stopped)
	requireTruth(t, b, turn.ID, err)
}

// TestStoppedLeaseCallerHearsTheTruth: the same for a Lease's run, whose
// write is its own transaction: the caller's context cancelled while the
// write waits for the task's row.
func TestStoppedLeaseCallerHearsTheTruth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	run, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	blocked, release := holdTaskRow(t, b, turn.ID)
	ctx, cancel := context.WithCancel(b.ctx)
	result := make(chan error, 1)
	go func() { result <- run.Complete(ctx, []byte(`"done"`)) }()
	waitUntil(t, "the write to wait for the task's row", blocked)
	cancel()
	release()
	requireTruth(t, b, turn.ID, <-result)
	require.NoError(t, lease.Release(b.ctx))
}
