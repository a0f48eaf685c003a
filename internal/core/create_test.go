package core_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

func TestCreateRootAndChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Input: js(`{"q": "hi"}`)})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, arbortype.StatusPending, root.Status)
	require.Zero(t, root.OwnerID)
	require.Equal(t, tasks.RestartLimitDefault, root.RestartLimit)
	require.JSONEq(t, `{"q": "hi"}`, string(root.Input))

	b.start(t, root.ID)
	c1 := b.child(t, root.ID, "tool")
	c2 := b.background(t, root.ID, "summarize")
	require.Equal(t, root.ID, c1.OwnerID)
	require.True(t, c2.Background)

	live, err := b.engine.Children(b.ctx, root.ID)
	require.NoError(t, err)
	require.Equal(t, []int64{c1.ID, c2.ID}, []int64{live[0].ID, live[1].ID})

	many, err := b.engine.GetMany(b.ctx, []int64{c2.ID, root.ID, c1.ID})
	require.NoError(t, err)
	require.Equal(t, []int64{root.ID, c1.ID, c2.ID}, []int64{many[0].ID, many[1].ID, many[2].ID}, "GetMany returns id order")
	_, err = b.engine.GetMany(b.ctx, []int64{root.ID, 1 << 60})
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	// Clean up the tree so the invariant check at the end sees a settled one.
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestCreateIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", IdempotencyKey: "msg-1"}
	first, created, err := b.engine.Create(b.ctx, p)
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := b.engine.Create(b.ctx, p)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)

	// The same key for a different task is refused, and writes nothing.
	before := b.snapshot(t)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "other", IdempotencyKey: "msg-1"})
	require.ErrorIs(t, err, arbortype.ErrIdempotencyConflict)
	require.Equal(t, before, b.snapshot(t))

	// Keys are per conversation.
	other, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "turn", IdempotencyKey: "msg-1"})
	require.NoError(t, err)
	require.True(t, created)
	require.NotEqual(t, first.ID, other.ID)
}

func TestCreateRolledBackWithCallerTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	task, created, err := b.engine.CreateTx(b.ctx, tx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	require.True(t, created)
	require.NoError(t, tx.Rollback(b.ctx))

	_, err = b.engine.Get(b.ctx, task.ID)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	require.Empty(t, b.snapshot(t), "neither the task nor the conversation exists")

	// And committed with the caller's transaction, it exists.
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	task, _, err = b.engine.CreateTx(b.ctx, tx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, arbortype.StatusPending, b.get(t, task.ID).Status)
}

func TestCreateTxRefusalLeavesCallerTxUsable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	_, _, err = b.engine.CreateTx(b.ctx, tx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: 1 << 60, Kind: "x"})
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	task, _, err := b.engine.CreateTx(b.ctx, tx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err, "the caller's transaction is still usable")
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, arbortype.StatusPending, b.get(t, task.ID).Status)
}

func TestCreateBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.root(t, "turn")
	b.start(t, root.ID)
	settled := b.child(t, root.ID, "done")
	done := b.start(t, settled.ID)
	_, err := b.engine.Complete(b.ctx, done.ID, done.Token, nil)
	require.NoError(t, err)
	completingOwner := b.child(t, root.ID, "holder")
	holder := b.start(t, completingOwner.ID)
	grandchild := b.child(t, holder.ID, "slow")
	_, err = b.engine.Complete(b.ctx, holder.ID, holder.Token, js(`1`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleting, b.get(t, holder.ID).Status)

	foreignConv := testdb.Conversation(t)
	foreign, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: foreignConv, Kind: "turn"})
	require.NoError(t, err)

	cases := []struct {
		name string
		p    arbortype.CreateParams
		want error
	}{
		{"empty kind", arbortype.CreateParams{ConversationID: b.conv}, arbortype.ErrInvalidArgument},
		{"long kind", arbortype.CreateParams{ConversationID: b.conv, Kind: strings.Repeat("k", 201)}, arbortype.ErrInvalidArgument},
		{"NUL in kind", arbortype.CreateParams{ConversationID: b.conv, Kind: "a\x00b"}, arbortype.ErrInvalidArgument},
		{"empty conversation", arbortype.CreateParams{Kind: "x"}, arbortype.ErrInvalidArgument},
		{"malformed input", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", Input: js(`{"a":`)}, arbortype.ErrInvalidJSON},
		{"NUL escape input", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", Input: js(`"a\u0000b"`)}, arbortype.ErrInvalidJSON},
		{"oversized input", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", Input: js(`"` + strings.Repeat("a", tasks.MaxPayloadBytesDefault) + `"`)}, arbortype.ErrPayloadTooLarge},
		{"unknown owner", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", OwnerID: 1 << 60}, arbortype.ErrNotFound},
		{"foreign owner", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", OwnerID: foreign.ID}, arbortype.ErrForeignOwner},
		{"settled owner", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", OwnerID: settled.ID}, arbortype.ErrOwnerNotLive},
		{"completing owner", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", OwnerID: holder.ID}, arbortype.ErrOwnerCompleting},
		{"background root", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", Background: true}, arbortype.ErrInvalidArgument},
		{"negative restart limit", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", RestartLimit: -7}, arbortype.ErrInvalidArgument},
		{"negative retries", arbortype.CreateParams{ConversationID: b.conv, Kind: "x", MaxRetries: -1}, arbortype.ErrInvalidArgument},
	}
	for _, tc := range cases {
		before := b.snapshot(t)
		_, _, err := b.engine.Create(b.ctx, tc.p)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.Equal(t, before, b.snapshot(t), "%s: nothing written", tc.name)
	}
	// A conversation that would be created by a refused create is not.
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "x", Input: js(`nope`)})
	require.ErrorIs(t, err, arbortype.ErrInvalidJSON)

	// Settle the rest so the conversations end consistent.
	child, err := b.engine.Start(b.ctx, grandchild.ID)
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, child.ID, child.Token, nil)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, b.get(t, holder.ID).Status, "the completing owner completed with its last child")
	_, err = b.engine.AbortConversation(b.ctx, foreignConv)
	require.NoError(t, err)
}

func TestCreateUnderAbortingOrSettledOwnerRace(t *testing.T) {
	t.Parallel()
	// Covered deterministically in race_test.go; here the plain case: once
	// the owner is aborted, its runner's spawn is refused.
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	_, err := b.engine.Abort(b.ctx, root.ID)
	require.NoError(t, err)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: root.ID, Kind: "late"})
	require.ErrorIs(t, err, arbortype.ErrOwnerNotLive)
}
