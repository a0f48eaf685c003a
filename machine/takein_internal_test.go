package machine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// TestEndingGoesInTheFlushHoldingItsConversation: an ending that comes
// while a flush of this node holds its conversation waits for that flush
// and goes in its commit, instead of a flush of its own that would find
// the conversation locked, skip it, and leave it for a flush after. Two
// children of one turn: the quick one's Complete is flushed and caught on
// its task row, which the test holds locked; the slow one's Complete comes
// meanwhile and is parked behind that flush; when the test lets go, one
// transaction writes both completions (their rows' xmin), and the turn is
// re-entered.
func TestEndingGoesInTheFlushHoldingItsConversation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		up        = make(chan int64, 2) // a child's handler started (its id)
		goQuick   = make(chan struct{})
		goSlow    = make(chan struct{})
		done      = make(chan error, 2) // a child's Complete returned
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
	child := func(gate <-chan struct{}) Handler {
		return func(ctx context.Context, run *Run) error {
			up <- run.Task.ID
			if err := wait(ctx, gate); err != nil {
				return err
			}
			err := run.Complete(ctx, nil)
			done <- err
			return err
		}
	}
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error {
			if run.Task.Phase == "after" {
				reentered <- run.Task.ID
				return run.Complete(ctx, nil)
			}
			kids, err := run.SpawnMany(ctx, []SpawnParams{{Kind: "quick"}, {Kind: "slow"}})
			if err != nil {
				return err
			}
			return run.Wait(ctx, WaitParams{ChildIDs: []int64{kids[0].ID, kids[1].ID}, Policy: arbortype.AllSettled, Phase: "after"})
		},
		"quick": child(goQuick),
		"slow":  child(goSlow),
	}
	ir := startInternalRunner(t, handlers, nil)
	r, eng, pool, schema, conv := ir.r, ir.eng, ir.pool, ir.schema, ir.conv
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

	turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	ids := []int64{recv("a child to run", up), recv("the other child to run", up)}
	kids, err := eng.GetMany(ctx, ids)
	require.NoError(t, err)
	var quick, slow int64
	for _, k := range kids {
		if k.Kind == "quick" {
			quick = k.ID
		} else {
			slow = k.ID
		}
	}
	// The turn's wait has landed (its children run after its spawn, but
	// the wait is a write of its own): nothing else of the conversation is
	// in flight when the quick child completes.
	waitFor(t, "the turn to wait", func() bool {
		t, err := eng.Get(ctx, turn.ID)
		return err == nil && t.Status == arbortype.StatusWaiting
	})

	// The test holds the quick child's row: its flush locks the
	// conversation and waits on the row.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `SELECT id FROM `+schema+`.tasks WHERE id = $1 FOR UPDATE`, quick)
	require.NoError(t, err)
	close(goQuick)
	waitFor(t, "the quick child's flush to wait on its row", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`,
			schema).Scan(&n))
		return n == 1
	})

	// The slow child's Complete comes while that flush holds the
	// conversation: it is parked behind it, not flushed on its own.
	close(goSlow)
	waitFor(t, "the slow child's Complete to wait behind the flush", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.outcomesAfter[conv]) == 1
	})
	require.NoError(t, tx.Rollback(ctx))
	for range 2 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(eventually):
			require.FailNow(t, "a child's Complete never returned")
		}
	}
	require.Equal(t, turn.ID, recv("the turn to be re-entered", reentered))

	var xmins []string
	rows, err := pool.Query(ctx, `SELECT xmin::text FROM `+schema+`.tasks WHERE id = ANY($1) AND status = 'completed' ORDER BY id`, []int64{quick, slow})
	require.NoError(t, err)
	xmins, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, xmins, 2, "both children completed")
	require.Equal(t, xmins[0], xmins[1], "both completions were written by the one flush that held the conversation")
}
