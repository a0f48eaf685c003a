package machine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// TestGracefulStopCountsNoRestart: a claim's transaction is in flight when
// Stop begins — a sleep's wake, claiming the woken task on this node, held
// by the test between its claim and its commit until Stop has begun. It
// commits before the release, and the run it claimed is not started: the release requeues the
// task, uncounted, and another runner runs it once with attempt 0 (issue
// 38: in a rolling deploy, tasks had attempt 1 though no handler ever ran
// attempt 0 and no runner was killed; a claim committed after the release
// left its task running under a holder that was going away).
func TestGracefulStopCountsNoRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var woken atomic.Int32
	handlers := map[string]Handler{
		"tool": func(ctx context.Context, run *Run) error {
			if run.Task.Phase == "slept" {
				woken.Add(1)
				return run.Complete(ctx, []byte(`"done"`))
			}
			return run.SleepUntil(ctx, time.Now().Add(200*time.Millisecond), "slept", nil)
		},
	}
	ir := startInternalRunner(t, handlers, nil)
	r := ir.r
	inClaim, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.mu.Lock()
	r.testClaimed = func(runs []arbortype.Task) {
		for _, t := range runs {
			if t.Phase == "slept" {
				once.Do(func() { close(inClaim); <-proceed })
			}
		}
	}
	r.mu.Unlock()
	tool, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "tool"})
	require.NoError(t, err)
	<-inClaim // the wake's transaction is in flight, its claim made
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	// The claim commits once Stop has begun (before its fix, it was then
	// dispatched and started or, with the runner's context cancelled
	// first, left running under a holder going away, neither released nor
	// entered; since, Stop waits for it at its barrier, and dispatch
	// starts nothing once Stop has begun).
	waitFor(t, "Stop to begin", r.isStopping)
	close(proceed)
	require.NoError(t, <-stopped)
	require.Zero(t, woken.Load(), "nothing a claim took after Stop began is started")
	got := ir.task(t, tool.ID)
	require.Equal(t, arbortype.StatusPending, got.Status, "the release requeued it")
	require.Zero(t, got.Attempt, "a graceful stop counts no restart")

	next, err := NewRunner(ir.eng.Engine, handlers, &RunnerConfig{ConversationLease: 5 * time.Second,
		PollInterval: 50 * time.Millisecond, Waker: &WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, next.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		require.NoError(t, next.Stop(stopCtx))
	})
	waitFor(t, "the tool to complete on the next runner", func() bool { return ir.task(t, tool.ID).Status == arbortype.StatusCompleted })
	require.Zero(t, ir.task(t, tool.ID).Attempt)
	require.EqualValues(t, 1, woken.Load(), "woken once")
}
