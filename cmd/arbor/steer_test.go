package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestAbortChangesTheTree aborts the waiting turn of the sample tree: its
// pending child is orphaned, it is aborted, leaves first, and its background
// child runs on. tree shows exactly that afterwards.
func TestAbortChangesTheTree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	out := b.arbor(t, "abort", "1").ok(t).stdout
	require.Equal(t, `abort #1 chat_turn: settled 2 tasks, leaves first:
  #4 ask_approval: pending → orphaned
  #1 chat_turn: waiting → aborted
`, out)

	want := fmt.Sprintf(`conversation %s
├── #1 chat_turn [aborted] phase=gathering attempt=0
│   ├── #2 search_web [completed] attempt=0
│   ├── #3 read_docs [failed] attempt=0 error="docs server returned 503"
│   ├── #4 ask_approval [orphaned] attempt=0
│   └── #5 summarize_history [running] attempt=0 (background)
└── #6 chat_turn [running] attempt=0
    └── #7 sub_agent [completing] attempt=0 holds its result, waits on #8
        └── #8 browse [pending] attempt=0
`, b.conv)
	require.Equal(t, want, b.arbor(t, "tree", b.conv, "--no-age").ok(t).stdout)
	require.Equal(t, arbortype.StatusAborted, b.get(t, 1).Status)
	b.requireInvariants(t)

	// A settled task cannot be aborted again; nothing changes.
	b.arbor(t, "abort", "#1").fails(t, 1, "cannot abort task 1: it is aborted (abort needs a task that is live)")
	require.Equal(t, want, b.arbor(t, "tree", b.conv, "--no-age").ok(t).stdout)
}

// TestAbortReportsTheOwnerItWakes aborts the last child a waiting owner
// waits on: the owner wakes in the same transaction, and abort says so.
func TestAbortReportsTheOwnerItWakes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	tool := b.start(t, b.create(t, turn.ID, "tool", false).ID)
	_, err := b.engine.WaitForChildren(b.ctx, turn.ID, turn.Token, core.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)

	require.Equal(t, `abort #2 tool: settled 1 task, leaves first:
  #2 tool: running → aborted
also changed in the conversation:
  #1 chat_turn: waiting → pending
`, b.arbor(t, "abort", "2").ok(t).stdout)
	require.Equal(t, arbortype.StatusPending, b.get(t, turn.ID).Status)
	b.requireInvariants(t)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	// A completing task cannot be cancelled.
	b.arbor(t, "cancel", "7").fails(t, 1, "cannot cancel task 7: it is completing")
	b.arbor(t, "cancel", "6", "--result", "{not json").fails(t, 1, "--result is not valid JSON")
	require.Equal(t, arbortype.StatusRunning, b.get(t, 6).Status)

	// Cancelling the second turn aborts its subtree first.
	require.Equal(t, `cancel #6 chat_turn:
  #6 chat_turn: running → cancelled
also changed in the conversation:
  #7 sub_agent: completing → aborted
  #8 browse: pending → orphaned
`, b.arbor(t, "cancel", "6", "--result", `{"reason": "operator"}`).ok(t).stdout)
	cancelled := b.get(t, 6)
	require.Equal(t, arbortype.StatusCancelled, cancelled.Status)
	require.JSONEq(t, `{"reason": "operator"}`, string(cancelled.Result))
	b.requireInvariants(t)
}

func TestWake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)

	b.arbor(t, "wake", "6").fails(t, 1, "cannot wake task 6: it is running (wake needs a task that is sleeping)")
	b.arbor(t, "wake", "1").fails(t, 1, "cannot wake task 1: it is waiting (wake needs a task that is sleeping)")
	napper := b.start(t, b.create(t, 0, "napper", false).ID)
	_, err := b.engine.SleepUntil(b.ctx, napper.ID, napper.Token, time.Now().Add(time.Hour), "napping", nil)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("wake #%[1]d napper:\n  #%[1]d napper: sleeping → pending\n", napper.ID),
		b.arbor(t, "wake", fmt.Sprint(napper.ID)).ok(t).stdout)
	woken := b.get(t, napper.ID)
	require.Equal(t, arbortype.StatusPending, woken.Status)
	require.Equal(t, "napping", woken.Phase, "it runs again from the sleep's phase")
	require.Empty(t, b.engine.SleepViolations(t, b.ctx, b.conv), "its wake job went with the sleep")
	b.requireInvariants(t)
}
