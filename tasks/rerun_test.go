package tasks_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// A failed tool under a turn that still waits on it (and on another tool)
// is rerun: the rerun carries the tool's checkpoint and budget, takes its
// place in the turn's wait, and the turn wakes on the rerun's settle, not
// on the failure. The failed tool stays failed; a second rerun of it is
// refused, a rerun of the rerun is not.
func TestRerunOfAFailedChildUnderAWaitingParent(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := t.Context()
	conv := testdb.Conversation(t)
	get := func(id int64) arbortype.Task {
		got, err := e.Get(ctx, id)
		require.NoError(t, err)
		return got
	}

	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	turnRun, err := e.Start(ctx, turn.ID)
	require.NoError(t, err)
	a, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "search", Input: json.RawMessage(`{"q":"x"}`),
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 500}}})
	require.NoError(t, err)
	b, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "fetch"})
	require.NoError(t, err)
	_, err = e.WaitForChildren(ctx, turn.ID, turnRun.Token, core.WaitParams{ChildIDs: []int64{a.ID, b.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)

	aRun, err := e.Start(ctx, a.ID)
	require.NoError(t, err)
	_, err = e.Checkpoint(ctx, a.ID, aRun.Token, "page-2", json.RawMessage(`{"cursor":2}`))
	require.NoError(t, err)
	_, err = e.Fail(ctx, a.ID, aRun.Token, arbortype.TaskError{Code: "upstream", Message: "503"})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusWaiting, get(turn.ID).Status, "the turn waits on the other tool")

	rerun, err := e.Rerun(ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, a.ID, rerun.RerunOf)
	require.Equal(t, arbortype.StatusPending, rerun.Status)
	require.Equal(t, turn.ID, rerun.OwnerID)
	require.Equal(t, "search", rerun.Kind)
	require.JSONEq(t, `{"q":"x"}`, string(rerun.Input))
	require.Equal(t, "page-2", rerun.Phase, "from the checkpoint")
	require.JSONEq(t, `{"cursor":2}`, string(rerun.State))
	require.Zero(t, rerun.Attempt)
	require.Nil(t, rerun.Error)
	require.Equal(t, arbortype.StatusFailed, get(a.ID).Status, "terminal stays terminal")
	require.Equal(t, []int64{rerun.ID, b.ID}, get(turn.ID).WaitIDs, "the rerun takes the tool's place in the wait")
	budgets, err := e.Budgets(ctx, conv)
	require.NoError(t, err)
	var limit *arbortype.Budget
	for i, bg := range budgets.Budgets {
		if bg.TaskID == rerun.ID {
			limit = &budgets.Budgets[i]
		}
	}
	require.NotNil(t, limit, "the tool's own budget is set on the rerun")
	require.Equal(t, int64(500), limit.Max)
	require.Zero(t, limit.Spent)

	_, err = e.Rerun(ctx, a.ID)
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition, "a task is rerun once")
	require.ErrorContains(t, err, "rerun that one")
	_, err = e.Rerun(ctx, rerun.ID)
	require.ErrorIs(t, err, arbortype.ErrNotSettled, "a live rerun is not rerun")

	bRun, err := e.Start(ctx, b.ID)
	require.NoError(t, err)
	_, err = e.Complete(ctx, b.ID, bRun.Token, nil)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusWaiting, get(turn.ID).Status, "still waiting, on the rerun")
	rRun, err := e.Start(ctx, rerun.ID)
	require.NoError(t, err)
	_, err = e.Complete(ctx, rerun.ID, rRun.Token, json.RawMessage(`"found"`))
	require.NoError(t, err)
	woken := get(turn.ID)
	require.Equal(t, arbortype.StatusPending, woken.Status, "woken by the rerun's settle")
	require.Equal(t, []int64{rerun.ID, b.ID}, woken.WaitIDs)
	vs, err := e.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// An aborted turn is rerun as a new turn of its conversation, from its
// checkpoint, newer than the live turn (so run after it, as any new turn).
func TestRerunOfAnAbortedTurn(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := t.Context()
	conv := testdb.Conversation(t)
	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Input: json.RawMessage(`"hi"`)})
	require.NoError(t, err)
	run, err := e.Start(ctx, turn.ID)
	require.NoError(t, err)
	_, err = e.Checkpoint(ctx, turn.ID, run.Token, "drafted", json.RawMessage(`{"draft":"hel"}`))
	require.NoError(t, err)
	_, err = e.AbortTurn(ctx, conv)
	require.NoError(t, err)
	next, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = e.Start(ctx, next.ID)
	require.NoError(t, err)

	rerun, err := e.Rerun(ctx, turn.ID)
	require.NoError(t, err)
	require.Zero(t, rerun.OwnerID, "a turn")
	require.Equal(t, turn.ID, rerun.RerunOf)
	require.Equal(t, "drafted", rerun.Phase)
	require.Equal(t, arbortype.StatusPending, rerun.Status)
	require.Greater(t, rerun.ID, next.ID, "a new turn: a runner runs it after the live one (the generation rule)")
	vs, err := e.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// What cannot be rerun is refused, with nothing written.
func TestRerunRefusals(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := t.Context()
	conv := testdb.Conversation(t)
	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	run, err := e.Start(ctx, turn.ID)
	require.NoError(t, err)
	tool, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "tool"})
	require.NoError(t, err)
	toolRun, err := e.Start(ctx, tool.ID)
	require.NoError(t, err)
	_, err = e.Fail(ctx, tool.ID, toolRun.Token, arbortype.TaskError{Code: "x"})
	require.NoError(t, err)
	_, err = e.Complete(ctx, turn.ID, run.Token, nil)
	require.NoError(t, err)
	orphan, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = e.Abort(ctx, orphan.ID)
	require.NoError(t, err)
	live, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)

	rows := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.tasks WHERE conversation_id = $1`, conv).Scan(&n))
		return n
	}
	before := rows()
	for _, c := range []struct {
		name string
		id   int64
		want error
	}{
		{"an unknown task", 1 << 60, arbortype.ErrNotFound},
		{"id 0", 0, arbortype.ErrInvalidArgument},
		{"a completed turn", turn.ID, arbortype.ErrInvalidTransition},
		{"an orphaned turn (nothing of it ran)", orphan.ID, arbortype.ErrInvalidTransition},
		{"a live turn", live.ID, arbortype.ErrNotSettled},
		{"a failed tool of a settled turn", tool.ID, arbortype.ErrOwnerNotLive},
	} {
		_, err := e.Rerun(ctx, c.id)
		require.ErrorIs(t, err, c.want, c.name)
		require.Equal(t, before, rows(), c.name+": nothing written")
	}
}
