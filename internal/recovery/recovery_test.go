package recovery_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// harness runs tasks under a lease of a holder that then "dies": its lease
// is expired by hand, and open takes the conversation over the way a runner
// does, in one transaction with recovery.OnOpen.
type harness struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	e      *tasks.Engine
	c      *core.Engine
	conv   string
	lease  *core.Lease
}

func newHarness(t *testing.T, pool *pgxpool.Pool, schema string) *harness {
	e, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	return &harness{t: t, ctx: context.Background(), pool: pool, schema: schema, e: e, c: core.Of(e), conv: testdb.Conversation(t)}
}

func (h *harness) tx(fn func(tx pgx.Tx) error) {
	h.t.Helper()
	_, err := core.Tx(h.ctx, h.c, func(tx pgx.Tx) (struct{}, error) { return struct{}{}, fn(tx) })
	require.NoError(h.t, err)
}

// start starts task under the dead holder's lease (taken on first use).
func (h *harness) start(task arbortype.Task) arbortype.Task {
	h.t.Helper()
	var started arbortype.Task
	h.tx(func(tx pgx.Tx) error {
		if h.lease == nil {
			holder, _, err := h.c.NewHolder(h.ctx, tx, "dead-node", time.Hour)
			if err != nil {
				return err
			}
			l, _, err := h.c.TakeLease(h.ctx, tx, h.conv, "dead-node", holder)
			if err != nil {
				return err
			}
			h.lease = &l
		}
		var err error
		started, err = h.c.Start(h.ctx, tx, *h.lease, task.ID)
		return err
	})
	return started
}

// open expires the dead holder's lease and takes the conversation over.
func (h *harness) open() reconcile.Report {
	h.t.Helper()
	// (The holders' guard refuses a deadline brought back: the test
	// writes it with the triggers off, a superuser's replica role.)
	err := pgx.BeginFunc(h.ctx, h.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(h.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(h.ctx, `UPDATE `+h.schema+`.holders SET expires_at = now() - interval '1 second'
			WHERE id = (SELECT holder_id FROM `+h.schema+`.conversations WHERE id = $1)`, h.conv)
		return err
	})
	require.NoError(h.t, err)
	var rep reconcile.Report
	h.tx(func(tx pgx.Tx) error {
		holder, _, err := h.c.NewHolder(h.ctx, tx, "node", time.Minute)
		if err != nil {
			return err
		}
		_, taken, err := h.c.TakeLease(h.ctx, tx, h.conv, "node", holder)
		if err != nil {
			return err
		}
		rep, err = recovery.OnOpen(h.ctx, h.c, tx, h.conv, taken.Counted())
		return err
	})
	return rep
}

func TestOnOpenRecoversRunningTasks(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	h := newHarness(t, pool, schema)
	ctx, e, c, conv := h.ctx, h.e, h.c, h.conv
	create := func(p arbortype.CreateParams) arbortype.Task {
		p.ConversationID = conv
		task, _, err := e.Create(ctx, p)
		require.NoError(t, err)
		return h.start(task)
	}
	root := create(arbortype.CreateParams{Kind: "turn"})
	requeue := create(arbortype.CreateParams{Kind: "step", OwnerID: root.ID})
	h.tx(func(tx pgx.Tx) error {
		_, err := c.Checkpoint(ctx, tx, requeue.ConversationID, requeue.ID, requeue.Token, "half-way", []byte(`{"page": 3}`))
		return err
	})
	abandon := create(arbortype.CreateParams{Kind: "pay", OwnerID: root.ID, AbandonOnRestart: true})
	underAbandon := create(arbortype.CreateParams{Kind: "receipt", OwnerID: abandon.ID})
	limited := create(arbortype.CreateParams{Kind: "llm", OwnerID: root.ID, RestartLimit: arbortype.RestartLimitNone})
	h.tx(func(tx pgx.Tx) error {
		res, err := c.WaitForChildren(ctx, tx, root.ID, root.Token, core.WaitParams{ChildIDs: []int64{abandon.ID, limited.ID}, Policy: arbortype.AllSettled})
		require.False(t, res.Woken)
		return err
	})

	rep := h.open()
	require.Equal(t, []int64{requeue.ID}, rep.Requeued, "the task under the abandoned one was aborted with it, not requeued")
	require.Equal(t, []int64{abandon.ID}, rep.Abandoned)
	require.Equal(t, []int64{limited.ID}, rep.LimitExceeded)
	require.Empty(t, rep.WaitsWoken, "the settles woke the root in their own transactions")

	got, err := e.GetMany(ctx, []int64{root.ID, requeue.ID, abandon.ID, underAbandon.ID, limited.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got[0].Status, "the root's wait (abandon + limited) is satisfied: woken")
	require.Equal(t, arbortype.StatusPending, got[1].Status)
	require.Equal(t, 1, got[1].Attempt)
	require.Equal(t, "half-way", got[1].Phase, "phase and state kept")
	require.Equal(t, arbortype.StatusCancelled, got[2].Status)
	require.Equal(t, arbortype.CodeAbandonedOnRestart, got[2].Error.Code)
	require.Equal(t, arbortype.StatusAborted, got[3].Status)
	require.Equal(t, arbortype.StatusFailed, got[4].Status)
	require.Equal(t, arbortype.CodeRestartLimitExceeded, got[4].Error.Code)
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
	pool, schema := testdb.Fresh(t)
	h := newHarness(t, pool, schema)
	ctx, e, c, conv := h.ctx, h.e, h.c, h.conv
	mk := func(owner int64) arbortype.Task {
		task, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "k", OwnerID: owner})
		require.NoError(t, err)
		return h.start(task)
	}
	waiter := mk(0)
	kid := mk(waiter.ID)
	h.tx(func(tx pgx.Tx) error {
		_, err := c.WaitForChildren(ctx, tx, waiter.ID, waiter.Token, core.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled})
		return err
	})
	top := mk(0)
	mid := mk(top.ID)
	leaf := mk(mid.ID)
	h.tx(func(tx pgx.Tx) error {
		if _, err := c.Complete(ctx, tx, top.ID, top.Token, nil); err != nil {
			return err
		}
		_, err := c.Complete(ctx, tx, mid.ID, mid.Token, nil)
		return err
	})
	_, err := pool.Exec(ctx, `ALTER TABLE `+schema+`.tasks DISABLE TRIGGER task_guard, DISABLE TRIGGER "Arbor_task_guard_update";
		UPDATE `+schema+`.tasks SET status = 'completed', token = NULL, lease_expires_at = NULL, settled_at = now(), settle_seq = 999999 WHERE id IN (`+
		itoa(kid.ID)+`, `+itoa(leaf.ID)+`);
		ALTER TABLE `+schema+`.tasks ENABLE TRIGGER task_guard, ENABLE TRIGGER "Arbor_task_guard_update"`)
	require.NoError(t, err)

	rep := h.open()
	require.Equal(t, []int64{waiter.ID}, rep.WaitsWoken)
	require.Equal(t, []int64{mid.ID}, rep.Completed, "the top completed with mid, in the same call")
	got, err := e.GetMany(ctx, []int64{waiter.ID, top.ID, mid.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got[0].Status)
	require.Equal(t, arbortype.StatusCompleted, got[1].Status)
	require.Equal(t, arbortype.StatusCompleted, got[2].Status)
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
