package machine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// TestLoneEndingDoesNotWaitBehindABatch: with every batch lane of the
// completer caught in flight (their completes wait on task rows the test
// holds locked) and a spawn queued behind them, a child's Complete in
// another conversation goes in the express flush: it returns, and its
// parent is re-entered, while the batches are still held and the spawn is
// still queued. Once the test lets go, the batches and the spawn land too.
func TestLoneEndingDoesNotWaitBehindABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type signal struct {
		id  int64
		err error
	}
	var (
		started   = make(chan int64, 8) // a held or spawner task's handler started
		goAhead   = map[string]chan struct{}{}
		completed = make(chan signal, 8) // a held task's Complete returned
		spawned   = make(chan signal, 1) // the spawner's Spawn returned
		childUp   = make(chan int64, 1)
		childGo   = make(chan struct{})
		childDone = make(chan error, 1)
		reentered = make(chan int64, 1)
	)
	wait := func(ctx context.Context, ch <-chan struct{}) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	held := []string{b.conv + "-held-1", b.conv + "-held-2"}
	spawner, lone := b.conv+"-spawner", b.conv+"-lone"
	for _, c := range append(held, spawner) {
		goAhead[c] = make(chan struct{})
	}
	fastRunner(t, b, map[string]machine.Handler{
		"held": func(ctx context.Context, run *machine.Run) error {
			started <- run.Task.ID
			if err := wait(ctx, goAhead[run.Task.ConversationID]); err != nil {
				return err
			}
			err := run.Complete(ctx, nil)
			completed <- signal{run.Task.ID, err}
			return err
		},
		"spawner": func(ctx context.Context, run *machine.Run) error {
			started <- run.Task.ID
			if err := wait(ctx, goAhead[run.Task.ConversationID]); err != nil {
				return err
			}
			_, err := run.Spawn(ctx, machine.SpawnParams{Kind: "leaf"})
			spawned <- signal{run.Task.ID, err}
			if err != nil {
				return err
			}
			return run.Complete(ctx, nil)
		},
		"leaf": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, nil) },
		"parent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "waiting" {
				reentered <- run.Task.ID
				return run.Complete(ctx, nil)
			}
			child, err := run.Spawn(ctx, machine.SpawnParams{Kind: "child"})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{child.ID}, Policy: arbortype.AllSettled, Phase: "waiting"})
		},
		"child": func(ctx context.Context, run *machine.Run) error {
			childUp <- run.Task.ID
			if err := wait(ctx, childGo); err != nil {
				return err
			}
			err := run.Complete(ctx, nil)
			childDone <- err
			return err
		},
	}, nil) // Flushers: the default, 2 batch lanes
	recv := func(what string, ch <-chan int64) int64 {
		t.Helper()
		select {
		case v := <-ch:
			return v
		case <-time.After(eventually):
			require.FailNow(t, "timed out waiting for "+what)
			return 0
		}
	}

	// The lone outcome's conversation: a parent waiting on its child, the
	// child's handler running.
	create := func(p arbortype.CreateParams) arbortype.Task {
		t.Helper()
		task, _, err := b.engine.Create(b.ctx, p)
		require.NoError(t, err)
		return task
	}
	parent := create(arbortype.CreateParams{ConversationID: lone, Kind: "parent"})
	recv("the child to run", childUp)
	// The parent's wait is an outcome of its own: landed before the held
	// tasks complete, so that it holds no batch lane then (a held
	// complete would go in the express lane, and the spawn find a lane).
	waitUntil(t, "the parent to wait", func() bool { return b.get(t, parent.ID).Status == arbortype.StatusWaiting })

	// The tasks whose completes make the batches, and the spawner.
	var heldIDs []int64
	for _, c := range held {
		heldIDs = append(heldIDs, create(arbortype.CreateParams{ConversationID: c, Kind: "held"}).ID)
	}
	create(arbortype.CreateParams{ConversationID: spawner, Kind: "spawner"})
	for range 3 {
		recv("the held tasks and the spawner to run", started)
	}

	// The test holds the held tasks' rows: a flush that completes one
	// waits for the test's transaction.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(b.ctx, `SELECT id FROM `+b.schema+`.tasks WHERE id = ANY($1) FOR UPDATE`, heldIDs)
	require.NoError(t, err)
	locked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.ElementsMatch(t, heldIDs, locked)
	// A batch lane waiting on a held row: its flush's complete (any other
	// statement of the schema waiting on a lock, a runner's read of its
	// runs say, is not one).
	waiting := func() int {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%' || $1 || '%' AND query LIKE '%result = v.result::jsonb%'`, b.schema)
	}
	// One complete at a time, so that each takes a batch lane of its own.
	for i, c := range held {
		close(goAhead[c])
		waitUntil(t, fmt.Sprintf("batch lane %d to wait on the held row", i+1), func() bool { return waiting() == i+1 })
	}
	// A spawn queued behind them: only a batch lane takes it.
	close(goAhead[spawner])

	close(childGo)
	select {
	case err := <-childDone:
		require.NoError(t, err, "the lone complete landed")
	case <-time.After(eventually):
		require.FailNow(t, "the lone complete waited behind the batches in flight")
	}
	require.Equal(t, parent.ID, recv("the parent to be re-entered", reentered))
	// Still held: both batches in flight, their completes not returned, the
	// spawn not flushed.
	require.Equal(t, 2, waiting(), "the batches are still in flight")
	select {
	case s := <-completed:
		require.FailNow(t, "a held complete returned while its row was locked", "task %d: %v", s.id, s.err)
	case s := <-spawned:
		require.FailNow(t, "the spawn was flushed while every batch lane was held", "task %d: %v", s.id, s.err)
	default:
	}

	require.NoError(t, tx.Rollback(b.ctx))
	for range held {
		select {
		case s := <-completed:
			require.NoError(t, s.err, "task %d", s.id)
		case <-time.After(eventually):
			require.FailNow(t, "a held complete never returned")
		}
	}
	select {
	case s := <-spawned:
		require.NoError(t, s.err)
	case <-time.After(eventually):
		require.FailNow(t, "the spawn never landed")
	}
	waitUntil(t, "every task to settle", func() bool { return b.liveTasks(t) == 0 })
	require.Equal(t, 6, b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE status = 'completed'`),
		"the parent, its child, the two held tasks, the spawner and its leaf completed")
	b.requireClean(t, append(held, spawner, lone)...)
}
