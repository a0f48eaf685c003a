package core_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

func TestWaitAllSettledWakesOnLastChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.start(t, b.root(t, "turn").ID)
	var kids []arbortype.Task
	for i := range 3 {
		kids = append(kids, b.start(t, b.child(t, parent.ID, fmt.Sprintf("tool%d", i)).ID))
	}
	res, err := b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{
		ChildIDs: []int64{kids[0].ID, kids[1].ID, kids[2].ID, kids[0].ID}, Policy: arbortype.AllSettled,
		Phase: "gathering", State: js(`{"n": 3}`)})
	require.NoError(t, err)
	require.False(t, res.Woken)
	require.Equal(t, arbortype.StatusWaiting, res.Task.Status)
	require.Equal(t, []int64{kids[0].ID, kids[1].ID, kids[2].ID}, res.Task.WaitIDs, "duplicates count once")
	require.Equal(t, "gathering", res.Task.Phase)

	_, err = b.engine.Fail(b.ctx, kids[0].ID, kids[0].Token, arbortype.TaskError{Message: "x"})
	require.NoError(t, err)
	_, err = b.engine.Cancel(b.ctx, kids[1].ID, nil)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusWaiting, b.get(t, parent.ID).Status, "all_settled waits for every child whatever its outcome")
	_, err = b.engine.Complete(b.ctx, kids[2].ID, kids[2].Token, js(`"r"`))
	require.NoError(t, err)
	woken := b.get(t, parent.ID)
	require.Equal(t, arbortype.StatusPending, woken.Status)
	require.Equal(t, "gathering", woken.Phase)
	require.JSONEq(t, `{"n": 3}`, string(woken.State))

	// After waking, the parent reads its children's outcomes.
	rerun := b.start(t, parent.ID)
	outcomes, err := b.engine.GetMany(b.ctx, rerun.WaitIDs)
	require.NoError(t, err)
	require.Equal(t, []arbortype.Status{arbortype.StatusFailed, arbortype.StatusCancelled, arbortype.StatusCompleted},
		[]arbortype.Status{outcomes[0].Status, outcomes[1].Status, outcomes[2].Status})
	_, err = b.engine.Complete(b.ctx, rerun.ID, rerun.Token, nil)
	require.NoError(t, err)
}

func TestWaitFailFastAbortsSiblingSubtrees(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.start(t, b.root(t, "turn").ID)
	a := b.start(t, b.child(t, parent.ID, "a").ID)
	sib := b.start(t, b.child(t, parent.ID, "b").ID)
	grand := b.child(t, sib.ID, "b.1")
	notWaited := b.start(t, b.child(t, parent.ID, "c").ID)
	_, err := b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{a.ID, sib.ID}, Policy: arbortype.FailFast})
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, a.ID, a.Token, arbortype.TaskError{Message: "no"})
	require.NoError(t, err)
	got, err := b.engine.GetMany(b.ctx, []int64{parent.ID, sib.ID, grand.ID, notWaited.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got[0].Status, "parent woken, not failed")
	require.Equal(t, arbortype.StatusAborted, got[1].Status)
	require.Equal(t, arbortype.StatusOrphaned, got[2].Status)
	require.Less(t, got[2].SettleSeq, got[1].SettleSeq, "bottom-up")
	require.Equal(t, arbortype.StatusRunning, got[3].Status, "a child not waited on is untouched")
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestWaitAlreadySatisfied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.start(t, b.root(t, "turn").ID)
	res, err := b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{Policy: arbortype.AllSettled, Phase: "nothing"})
	require.NoError(t, err)
	require.True(t, res.Woken, "an empty wait is satisfied at once: the task is woken in the same transaction")
	require.Equal(t, arbortype.StatusPending, res.Task.Status)
	require.Equal(t, "nothing", res.Task.Phase, "phase saved with the wait")
	_, err = b.engine.Checkpoint(b.ctx, parent.ID, parent.Token, "x", nil)
	require.ErrorIs(t, err, arbortype.ErrNotRunning, "the run that waited is over")
	parent = b.start(t, parent.ID) // the re-entry

	// fail_fast on a child that already failed: satisfied, and the live
	// sibling is aborted at once.
	failed := b.start(t, b.child(t, parent.ID, "a").ID)
	_, err = b.engine.Fail(b.ctx, failed.ID, failed.Token, arbortype.TaskError{Message: "x"})
	require.NoError(t, err)
	live := b.child(t, parent.ID, "b")
	res, err = b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{failed.ID, live.ID}, Policy: arbortype.FailFast})
	require.NoError(t, err)
	require.True(t, res.Woken)
	require.Equal(t, arbortype.StatusOrphaned, b.get(t, live.ID).Status)
	require.Equal(t, []int64{failed.ID, live.ID}, res.Task.WaitIDs)
	parent = b.start(t, parent.ID)
	_, err = b.engine.Complete(b.ctx, parent.ID, parent.Token, nil)
	require.NoError(t, err, "the re-entry completes")
}

func TestWaitBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.start(t, b.root(t, "turn").ID)
	kid := b.child(t, parent.ID, "kid")
	other := b.start(t, b.root(t, "other").ID)
	stranger := b.child(t, other.ID, "stranger")
	grandchild := b.child(t, kid.ID, "grand")
	pendingTask := b.root(t, "pending")
	cases := []struct {
		name  string
		id    int64
		token int64
		p     core.WaitParams
		want  error
	}{
		{"not a child", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{stranger.ID}, Policy: arbortype.AllSettled}, arbortype.ErrNotChild},
		{"a grandchild", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{grandchild.ID}, Policy: arbortype.AllSettled}, arbortype.ErrNotChild},
		{"itself", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{parent.ID}, Policy: arbortype.AllSettled}, arbortype.ErrNotChild},
		{"unknown child", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{1 << 60}, Policy: arbortype.AllSettled}, arbortype.ErrNotChild},
		{"bad policy", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{kid.ID}, Policy: "some"}, arbortype.ErrInvalidArgument},
		{"bad state", parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled, State: js(`[`)}, arbortype.ErrInvalidJSON},
		{"stale token", parent.ID, parent.Token + 1000, core.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled}, arbortype.ErrLeaseLost},
		{"not running", pendingTask.ID, 1, core.WaitParams{ChildIDs: []int64{}, Policy: arbortype.AllSettled}, arbortype.ErrNotRunning},
		{"unknown task", 1 << 60, 1, core.WaitParams{Policy: arbortype.AllSettled}, arbortype.ErrNotFound},
	}
	for _, tc := range cases {
		before := b.snapshot(t)
		_, err := b.engine.WaitForChildren(b.ctx, tc.id, tc.token, tc.p)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.Equal(t, before, b.snapshot(t), "%s: nothing written", tc.name)
	}
	_, err := b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestCompletingHoldsResultUntilLastForegroundChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	mid := b.start(t, b.child(t, root.ID, "agent").ID)
	leaf := b.start(t, b.child(t, mid.ID, "tool").ID)
	bg := b.background(t, mid.ID, "bg")

	held, err := b.engine.Complete(b.ctx, root.ID, root.Token, js(`"root result"`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleting, held.Status)
	held, err = b.engine.Complete(b.ctx, mid.ID, mid.Token, js(`"mid result"`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleting, held.Status, "background children do not count, the leaf does")

	_, err = b.engine.Complete(b.ctx, leaf.ID, leaf.Token, nil)
	require.NoError(t, err)
	got, err := b.engine.GetMany(b.ctx, []int64{root.ID, mid.ID, bg.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, got[0].Status, "completion climbs the tree in one transaction")
	require.JSONEq(t, `"root result"`, string(got[0].Result))
	require.Equal(t, arbortype.StatusCompleted, got[1].Status)
	require.Less(t, got[1].SettleSeq, got[0].SettleSeq)
	require.Equal(t, arbortype.StatusPending, got[2].Status, "the background child lives on")
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestCancelAbortsForegroundChildrenFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	task := b.start(t, b.child(t, root.ID, "agent").ID)
	kid := b.start(t, b.child(t, task.ID, "tool").ID)
	bg := b.background(t, task.ID, "bg")
	_, err := b.engine.WaitForChildren(b.ctx, root.ID, root.Token, core.WaitParams{ChildIDs: []int64{task.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)

	cancelled, err := b.engine.Cancel(b.ctx, task.ID, js(`{"reason": "user"}`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCancelled, cancelled.Status)
	require.JSONEq(t, `{"reason": "user"}`, string(cancelled.Result))
	got, err := b.engine.GetMany(b.ctx, []int64{root.ID, kid.ID, bg.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got[0].Status, "the owner was reconciled: its wait is satisfied")
	require.Equal(t, arbortype.StatusAborted, got[1].Status)
	require.Less(t, got[1].SettleSeq, cancelled.SettleSeq)
	require.Equal(t, arbortype.StatusPending, got[2].Status, "background untouched")

	// A settled or unknown task cannot be cancelled or aborted; nothing written.
	before := b.snapshot(t)
	_, err = b.engine.Cancel(b.ctx, task.ID, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
	_, err = b.engine.Abort(b.ctx, task.ID)
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
	_, err = b.engine.Cancel(b.ctx, 1<<60, nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = b.engine.Abort(b.ctx, 1<<60)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = b.engine.AbortConversation(b.ctx, "no-such-conversation-"+b.conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	require.Equal(t, before, b.snapshot(t))
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestAbortConversationReachesBackground(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	bg := b.start(t, b.background(t, root.ID, "bg").ID)
	bgKid := b.child(t, bg.ID, "bg.kid")
	rep, err := b.engine.Abort(b.ctx, root.ID)
	require.NoError(t, err)
	require.Len(t, rep.Settled, 1, "Abort leaves background subtrees alone")
	require.Equal(t, arbortype.StatusRunning, b.get(t, bg.ID).Status)

	rep, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, []int64{bgKid.ID, bg.ID}, []int64{rep.Settled[0].ID, rep.Settled[1].ID})
	require.Equal(t, arbortype.StatusOrphaned, b.get(t, bgKid.ID).Status)
	require.Equal(t, arbortype.StatusAborted, b.get(t, bg.ID).Status)
}

// TestAbortReportsTheRowsAsSettled: the report of an abort is the rows
// it wrote — status, settle_seq, settled_at, the reason as the target's
// error — not the rows as they were locked before the settle, so a
// caller can show the settle without reading every task again.
func TestAbortReportsTheRowsAsSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	tool := b.start(t, b.child(t, root.ID, "tool").ID)
	never := b.child(t, tool.ID, "never.ran")
	_, err := b.engine.SleepUntil(b.ctx, tool.ID, tool.Token, time.Now().Add(time.Hour), "napping", nil)
	require.NoError(t, err)
	bg := b.start(t, b.background(t, root.ID, "bg").ID)

	requireAsStored := func(rep tasks.AbortReport, ids ...int64) {
		t.Helper()
		var got []int64
		var last int64
		for _, s := range rep.Settled {
			got = append(got, s.ID)
			require.Equal(t, b.get(t, s.ID), s, "task %d is reported as it was settled", s.ID)
			require.True(t, s.Status.Settled())
			require.NotZero(t, s.SettleSeq)
			require.NotNil(t, s.SettledAt)
			require.Greater(t, s.SettleSeq, last, "in settle order")
			last = s.SettleSeq
		}
		require.Equal(t, ids, got, "leaves first")
	}
	rep, err := b.engine.Abort(b.ctx, root.ID, tasks.WithReason("the user pressed stop"))
	require.NoError(t, err)
	requireAsStored(rep, never.ID, tool.ID, root.ID)
	require.Equal(t, arbortype.StatusOrphaned, rep.Settled[0].Status)
	require.Equal(t, arbortype.StatusAborted, rep.Settled[1].Status)
	require.Equal(t, &arbortype.TaskError{Code: arbortype.CodeAborted, Message: "the user pressed stop"}, rep.Settled[2].Error)
	require.True(t, rep.Settled[2].AbortRequested)

	rep, err = b.engine.AbortConversation(b.ctx, b.conv, tasks.WithReason("closed"))
	require.NoError(t, err)
	requireAsStored(rep, bg.ID)
	require.Nil(t, rep.Settled[0].Error, "the reason goes on the conversation's live roots only")
}

// TestSettleErrorIsInTheLog: a settle's log entry carries its error's
// code and message — an abort's reason, a failure's message — so a
// follower of the conversation learns why without reading the task.
func TestSettleErrorIsInTheLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.start(t, b.root(t, "turn").ID)
	tool := b.start(t, b.child(t, root.ID, "tool").ID)
	_, err := b.engine.Fail(b.ctx, tool.ID, tool.Token, arbortype.TaskError{Message: "the tool broke"})
	require.NoError(t, err)
	_, err = b.engine.Abort(b.ctx, root.ID, tasks.WithReason("the user pressed stop"))
	require.NoError(t, err)

	entries, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	why := map[int64]*arbortype.TaskError{}
	for _, en := range entries {
		if en.Terminal() {
			why[en.TaskID] = en.SettleError()
		} else {
			require.Nil(t, en.SettleError(), "entry %d (%s %s) is no settle", en.Seq, en.Kind, en.Status)
		}
	}
	require.Equal(t, map[int64]*arbortype.TaskError{
		tool.ID: {Message: "the tool broke"},
		root.ID: {Code: arbortype.CodeAborted, Message: "the user pressed stop"},
	}, why)
}
