package tasks_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Stop aborts the turn under way with its foreground subtree; its
// background child and the turn queued behind it stay; a second stop
// aborts the next turn; with nothing live a stop is an empty report.
func TestAbortTurnStopsTheTurnUnderWay(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := t.Context()
	conv := testdb.Conversation(t)
	_, err := e.AbortTurn(ctx, conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	started, err := e.Start(ctx, turn.ID)
	require.NoError(t, err)
	tool, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "tool"})
	require.NoError(t, err)
	summary, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "summary", Background: true})
	require.NoError(t, err)
	queued, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	require.NotZero(t, started.Token)

	rep, err := e.AbortTurn(ctx, conv, tasks.WithReason("the user pressed stop"))
	require.NoError(t, err)
	var ids []int64
	for _, s := range rep.Settled {
		ids = append(ids, s.ID)
	}
	require.Equal(t, []int64{tool.ID, turn.ID}, ids, "the tool, then the turn")
	get := func(id int64) arbortype.Task {
		got, err := e.Get(ctx, id)
		require.NoError(t, err)
		return got
	}
	require.Equal(t, arbortype.StatusAborted, get(turn.ID).Status)
	require.Equal(t, "the user pressed stop", get(turn.ID).Error.Message)
	require.Equal(t, arbortype.StatusPending, get(summary.ID).Status, "background work stays")
	require.Equal(t, arbortype.StatusPending, get(queued.ID).Status, "the queued turn stays, and runs next")

	rep, err = e.AbortTurn(ctx, conv)
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1)
	require.Equal(t, queued.ID, rep.Settled[0].ID)
	require.Equal(t, arbortype.StatusOrphaned, rep.Settled[0].Status, "it never ran")

	rep, err = e.AbortTurn(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, rep.Settled, "nothing live: an empty report")
	_, err = e.Abort(ctx, summary.ID)
	require.NoError(t, err)
	vs, err := e.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
}
