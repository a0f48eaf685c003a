package machine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestAbortedBeforeEntryIsNeverEntered: a run's claim commits, its task is
// aborted, and only then is the run dispatched: the entry check reads the
// task back and the handler is never entered (issue 38: handlers entered
// 0.02–0.72 s after their task's abort, with a live context). The test
// holds Runner.claimMu so that no claim of the runner's takes the task
// first, and claims it as a flush does.
func TestAbortedBeforeEntryIsNeverEntered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) },
		"tool": func(ctx context.Context, run *Run) error {
			calls.Add(1)
			return run.Complete(ctx, nil)
		},
	}
	ir := startInternalRunner(t, handlers, func(c *RunnerConfig) {
		c.IdleRelease = time.Minute // the conversation stays held while idle
		c.PollInterval = time.Minute
	})
	r := ir.r
	ir.holdIdle(t)
	r.claimMu.Lock()
	locked := true
	defer func() {
		if locked {
			r.claimMu.Unlock()
		}
	}()
	tool, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "tool"})
	require.NoError(t, err)
	var claimed []arbortype.Task
	_, err = core.Tx(ctx, r.core, func(tx pgx.Tx) (struct{}, error) {
		p := r.claimParams(1)
		p.Conversations = []string{ir.conv}
		var err error
		claimed, _, err = r.core.ClaimFor(ctx, tx, p)
		return struct{}{}, err
	})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = ir.eng.Abort(ctx, tool.ID)
	require.NoError(t, err)
	r.mu.Lock()
	r.busy++ // its slot, as a claim reserves one
	r.mu.Unlock()
	r.dispatch(claimed)
	waitFor(t, "the run to end", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.runs[tool.ID] == nil
	})
	require.Zero(t, calls.Load(), "a task aborted before its run's entry is never entered")
	r.claimMu.Unlock()
	locked = false
	require.Equal(t, arbortype.StatusAborted, ir.task(t, tool.ID).Status)
}

// TestAbortReachesARunningHandlerWithinAPoll: a handler whose task is
// aborted while it runs has its context cancelled by the first read-back
// after the abort's commit: on its notification, and at the latest by the
// watchdog's next poll of every run (docs/design.md §3.8, "Entry"). The
// test counts the watchdog's polls: by the end of the second poll that
// ends after the commit (the first may have read before it), the context
// is cancelled.
func TestAbortReachesARunningHandlerWithinAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	entered, cancelled := make(chan context.Context, 1), make(chan struct{})
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error {
			entered <- ctx
			<-ctx.Done()
			close(cancelled)
			return ctx.Err()
		},
	}
	ir := startInternalRunner(t, handlers, func(c *RunnerConfig) { c.PollInterval = 200 * time.Millisecond })
	turn, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "turn"})
	require.NoError(t, err)
	handlerCtx := <-entered
	_, err = ir.eng.Abort(ctx, turn.ID)
	require.NoError(t, err)
	polls := ir.r.watch.polls.Load()
	waitFor(t, "the handler's context to be cancelled, or two polls", func() bool {
		return handlerCtx.Err() != nil || ir.r.watch.polls.Load() >= polls+2
	})
	// The poll cancels the context before it counts itself, so the context
	// is checked, not the handler's return, which may come later on a busy
	// machine.
	require.Error(t, handlerCtx.Err(), "two polls of every run after the abort's commit, and the handler's context still live")
	require.ErrorIs(t, context.Cause(handlerCtx), ErrTaskStopped)
	<-cancelled
}
