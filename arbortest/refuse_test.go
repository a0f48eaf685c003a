package arbortest_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Work refuses a task it cannot run as a Runner would, with arbor's word
// for why, and writes nothing: the handler is never called.
func TestWorkRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	called := false
	h := func(ctx context.Context, run *machine.Run) error { called = true; return nil }

	done := b.create(t, arbortype.CreateParams{Kind: "turn"})
	arbortest.Work(b.ctx, t, b.engine, h, done)
	called = false
	settled := arbortest.RequireSettled(b.ctx, t, b.engine, done, arbortype.StatusCompleted, nil)

	held := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-held", Kind: "turn"})
	lease, err := machine.AcquireLease(b.ctx, b.engine, b.conv+"-held", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })

	for _, tc := range []struct {
		name    string
		engine  *tasks.Engine
		handler machine.Handler
		id      int64
		want    []string
	}{
		{"not found", b.engine, h, 424242, []string{"424242", "not found"}},
		{"settled", b.engine, h, done, []string{"start", "completed"}},
		{"conversation held", b.engine, h, held, []string{"held"}},
		{"nil handler", b.engine, nil, done, []string{"handler", "nil"}},
		{"nil engine", nil, h, done, []string{"engine is nil"}},
	} {
		f := &fakeTB{TB: t}
		require.Nil(t, arbortest.Work(b.ctx, f, tc.engine, tc.handler, tc.id), tc.name)
		f.requireFailed(t, tc.want...)
		require.False(t, called, "%s: the handler is not called", tc.name)
	}
	again := arbortest.RequireSettled(b.ctx, t, b.engine, done, arbortype.StatusCompleted, nil)
	require.Equal(t, settled.UpdatedAt, again.UpdatedAt, "nothing was written to the settled task")
	pending := arbortest.RequireStatus(b.ctx, t, b.engine, held, arbortype.StatusPending)
	require.Nil(t, pending.StartedAt, "the held conversation's task was not started")
}

// Each Require helper passes on what it requires and fails, saying what it
// found, on anything else.
func TestRequireHelpersFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turnID := b.create(t, arbortype.CreateParams{Kind: "turn"})
	res := arbortest.Work(b.ctx, t, b.engine, turn, turnID)
	toolID := res.Spawned[0].ID
	arbortest.Work(b.ctx, t, b.engine, search, toolID)
	askID := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-ask", Kind: "ask"})
	arbortest.Work(b.ctx, t, b.engine, func(ctx context.Context, run *machine.Run) error {
		return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval"})
	}, askID)
	f := &fakeTB{TB: t}

	// Passing.
	require.Equal(t, toolID, arbortest.RequireSettled(b.ctx, f, b.engine, toolID, arbortype.StatusCompleted, json.RawMessage(`"sunny"`)).ID)
	require.Equal(t, turnID, arbortest.RequireStatus(b.ctx, f, b.engine, turnID, arbortype.StatusPending).ID)
	require.Len(t, arbortest.RequireChildren(b.ctx, f, b.engine, turnID, "search", 1), 1)
	require.Len(t, arbortest.RequireChildren(b.ctx, f, b.engine, turnID, "", 1), 1)
	require.Equal(t, askID, arbortest.RequirePendingEvent(b.ctx, f, b.engine, askID, "approval").TaskID)
	arbortest.RequireConsistent(b.ctx, f, b.engine, b.conv)
	f.requirePassed(t)

	// Failing.
	require.Zero(t, arbortest.RequireSettled(b.ctx, f, b.engine, toolID, arbortype.StatusCompleted, json.RawMessage(`"rainy"`)).ID)
	f.requireFailed(t, "RequireSettled", `result "sunny"`, `want "rainy"`)
	arbortest.RequireSettled(b.ctx, f, b.engine, toolID, arbortype.StatusFailed, nil)
	f.requireFailed(t, "is completed, want failed", `result "sunny"`)
	arbortest.RequireSettled(b.ctx, f, b.engine, turnID, arbortype.StatusCompleted, nil)
	f.requireFailed(t, "is pending, want completed", `phase "answer"`)
	arbortest.RequireSettled(b.ctx, f, b.engine, turnID, arbortype.StatusWaiting, nil)
	f.requireFailed(t, `"waiting" is not a settled status`)
	arbortest.RequireSettled(b.ctx, f, b.engine, toolID, arbortype.StatusCompleted, json.RawMessage(`{not json`))
	f.requireFailed(t, "wanted result", "not JSON")
	arbortest.RequireSettled(b.ctx, f, b.engine, 424242, arbortype.StatusCompleted, nil)
	f.requireFailed(t, "424242", "not found")
	arbortest.RequireStatus(b.ctx, f, b.engine, turnID, arbortype.StatusSleeping)
	f.requireFailed(t, "RequireStatus", "is pending, want sleeping")
	arbortest.RequireStatus(b.ctx, f, b.engine, turnID, "asleep")
	f.requireFailed(t, `"asleep" is not a status`)
	require.Nil(t, arbortest.RequireChildren(b.ctx, f, b.engine, turnID, "search", 2))
	f.requireFailed(t, `has 1 children of kind "search", want 2`, "search [completed]")
	arbortest.RequireChildren(b.ctx, f, b.engine, toolID, "", 1)
	f.requireFailed(t, "has 0 children, want 1", "none")
	arbortest.RequirePendingEvent(b.ctx, f, b.engine, askID, "payment")
	f.requireFailed(t, `does not await "payment"`, `awaits "approval"`)
	arbortest.RequirePendingEvent(b.ctx, f, b.engine, turnID, "approval")
	f.requireFailed(t, `does not await "approval"`, "none")
	arbortest.RequireStatus(b.ctx, f, nil, turnID, arbortype.StatusPending)
	f.requireFailed(t, "engine is nil")
}
