package reconcile_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func TestOnOpenRecoversRunningTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Shared(t)
	e, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	create := func(p tasks.CreateParams) tasks.Task {
		p.ConversationID = conv
		task, _, err := e.Create(ctx, p)
		require.NoError(t, err)
		started, err := e.Start(ctx, task.ID)
		require.NoError(t, err)
		return started
	}
	root := create(tasks.CreateParams{Kind: "turn"})
	requeue := create(tasks.CreateParams{Kind: "step", OwnerID: root.ID})
	_, err = e.Checkpoint(ctx, requeue.ID, requeue.Token, "half-way", []byte(`{"page": 3}`))
	require.NoError(t, err)
	abandon := create(tasks.CreateParams{Kind: "pay", OwnerID: root.ID, AbandonOnRestart: true})
	underAbandon := create(tasks.CreateParams{Kind: "receipt", OwnerID: abandon.ID})
	limited := create(tasks.CreateParams{Kind: "llm", OwnerID: root.ID, RestartLimit: tasks.RestartLimitNone})
	res, err := e.WaitForChildren(ctx, root.ID, root.Token, tasks.WaitParams{ChildIDs: []int64{abandon.ID, limited.ID}, Policy: tasks.AllSettled})
	require.NoError(t, err)
	require.False(t, res.Satisfied)

	var rep reconcile.Report
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := e.Store().TakeConversation(ctx, tx, conv, "node", time.Minute); err != nil {
			return err
		}
		rep, err = reconcile.OnOpen(ctx, e, tx, conv)
		return err
	}))
	require.Equal(t, []int64{requeue.ID}, rep.Requeued, "the task under the abandoned one was aborted with it, not requeued")
	require.Equal(t, []int64{abandon.ID}, rep.Abandoned)
	require.Equal(t, []int64{limited.ID}, rep.LimitExceeded)
	require.Empty(t, rep.WaitsWoken, "the settles woke the root in their own transactions")

	got, err := e.GetMany(ctx, []int64{root.ID, requeue.ID, abandon.ID, underAbandon.ID, limited.ID})
	require.NoError(t, err)
	require.Equal(t, fsm.Pending, got[0].Status, "the root's wait (abandon + limited) is satisfied: woken")
	require.Equal(t, fsm.Pending, got[1].Status)
	require.Equal(t, 1, got[1].Attempt)
	require.Equal(t, "half-way", got[1].Phase, "phase and state kept")
	require.Equal(t, fsm.Cancelled, got[2].Status)
	require.Equal(t, tasks.CodeAbandonedOnRestart, got[2].Error.Code)
	require.Equal(t, fsm.Aborted, got[3].Status)
	require.Equal(t, fsm.Failed, got[4].Status)
	require.Equal(t, tasks.CodeRestartLimitExceeded, got[4].Error.Code)
	vs, err := e.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
	_, err = e.AbortConversation(ctx, conv)
	require.NoError(t, err)
}

// TestOnOpenRepairsWaitsAndCompleting: rows written behind the engine's back
// (the guard trigger disabled, as a restore from a backup might) are
// repaired: a satisfied wait wakes, a completing task with no live child
// completes, and its completing owner after it.
func TestOnOpenRepairsWaitsAndCompleting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	e, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	mk := func(owner int64) tasks.Task {
		task, _, err := e.Create(ctx, tasks.CreateParams{ConversationID: conv, Kind: "k", OwnerID: owner})
		require.NoError(t, err)
		run, err := e.Start(ctx, task.ID)
		require.NoError(t, err)
		return run
	}
	waiter := mk(0)
	kid := mk(waiter.ID)
	_, err = e.WaitForChildren(ctx, waiter.ID, waiter.Token, tasks.WaitParams{ChildIDs: []int64{kid.ID}, Policy: tasks.AllSettled})
	require.NoError(t, err)
	top := mk(0)
	mid := mk(top.ID)
	leaf := mk(mid.ID)
	_, err = e.Complete(ctx, top.ID, top.Token, nil)
	require.NoError(t, err)
	_, err = e.Complete(ctx, mid.ID, mid.Token, nil)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE `+schema+`.tasks DISABLE TRIGGER task_guard;
		UPDATE `+schema+`.tasks SET status = 'completed', token = NULL, lease_expires_at = NULL, settled_at = now(), settle_seq = 999999 WHERE id IN (`+
		itoa(kid.ID)+`, `+itoa(leaf.ID)+`);
		ALTER TABLE `+schema+`.tasks ENABLE TRIGGER task_guard`)
	require.NoError(t, err)

	var rep reconcile.Report
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := e.Store().TakeConversation(ctx, tx, conv, "node", time.Minute); err != nil {
			return err
		}
		rep, err = reconcile.OnOpen(ctx, e, tx, conv)
		return err
	}))
	require.Equal(t, []int64{waiter.ID}, rep.WaitsWoken)
	require.Equal(t, []int64{mid.ID}, rep.Completed, "the top completed with mid, in the same call")
	got, err := e.GetMany(ctx, []int64{waiter.ID, top.ID, mid.ID})
	require.NoError(t, err)
	require.Equal(t, fsm.Pending, got[0].Status)
	require.Equal(t, fsm.Completed, got[1].Status)
	require.Equal(t, fsm.Completed, got[2].Status)
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestGenerations(t *testing.T) {
	t.Parallel()
	now := time.Now()
	root := func(id int64, kind string, st fsm.Status, started bool) tasks.Task {
		r := tasks.Task{ID: id, Kind: kind, Status: st}
		if started {
			r.StartedAt = &now
		}
		return r
	}
	all := func(string) bool { return true }
	// None under way: the oldest pending generation, and non-generations.
	roots := []tasks.Task{root(1, "turn", fsm.Pending, false), root(2, "turn", fsm.Pending, false), root(3, "cron", fsm.Pending, false)}
	isTurn := func(k string) bool { return k == "turn" }
	require.Equal(t, []int64{1, 3}, reconcile.Generations(roots, isTurn))
	require.Equal(t, []int64{1}, reconcile.Generations(roots[:2], nil))
	require.Equal(t, int64(1), reconcile.NextPendingGeneration(roots, all).ID)
	// One waiting: nothing else starts; it is the next waiting generation.
	roots = []tasks.Task{root(1, "turn", fsm.Waiting, true), root(2, "turn", fsm.Pending, false)}
	require.Empty(t, reconcile.Generations(roots, nil))
	require.Equal(t, int64(1), reconcile.NextWaitingGeneration(roots, nil).ID)
	// The one under way was woken (pending, started): it resumes, not the next.
	roots = []tasks.Task{root(1, "turn", fsm.Pending, true), root(2, "turn", fsm.Pending, false)}
	require.Equal(t, []int64{1}, reconcile.Generations(roots, nil))
	require.Nil(t, reconcile.NextWaitingGeneration(roots, nil))
}
