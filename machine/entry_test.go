package machine_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// TestWaitingRunOfAnAbortedTaskIsNeverEntered: a turn waits on a tool and
// its handler goes on running after its Wait (a late return). The tool
// completes, the turn's next run is claimed and waits for that handler to
// return; the turn is aborted meanwhile. When the first handler returns,
// the waiting run is not entered (issue 38: Runner.stopRuns skipped the
// runs waiting for their task's previous handler, which were then entered
// after the abort).
func TestWaitingRunOfAnAbortedTaskIsNeverEntered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu    sync.Mutex
		calls int
		first int64 // the token of the turn's first run
	)
	waited, release := make(chan struct{}), make(chan struct{})
	r := fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			mu.Lock()
			calls++
			isFirst := calls == 1
			if isFirst {
				first = run.Task.Token
			}
			mu.Unlock()
			if !isFirst {
				return run.Complete(ctx, nil)
			}
			tool, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"})
			if err != nil {
				return err
			}
			if err := run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled}); err != nil {
				return err
			}
			close(waited)
			<-release // returns late: the turn's next run waits for it
			return nil
		},
		"tool": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, nil) },
	}, nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	<-waited
	// The next run may be claimed before the test reads the turn: the
	// first run's token is the one its handler got.
	mu.Lock()
	firstToken := first
	mu.Unlock()
	waitUntil(t, "the turn's next run to be claimed", func() bool {
		got := b.get(t, turn.ID)
		return got.Status == arbortype.StatusRunning && got.Token != firstToken
	})
	_, err = b.engine.Abort(b.ctx, turn.ID)
	require.NoError(t, err)
	close(release)
	// The conversation is released once no run of it is left here, running
	// or waiting (IdleRelease after).
	waitUntil(t, "the conversation to be released", func() bool { return !slices.Contains(r.Held(), b.conv) })
	got, err := b.engine.AwaitSettled(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusAborted, got.Status)
	b.requireClean(t)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, calls, "the run claimed before the abort, waiting for the previous handler, is never entered")
}
