package machine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestResolveChecksACommitAgainstTheTasks: a flush whose commit's answer
// was lost is resolved by its transaction's id, but after a failover that
// id may be another transaction's (the promoted standby gives out again
// the ids of transactions whose records never reached it). So a flush the
// id calls committed is checked against its tasks: an ending whose task is
// still running under its run's token did not land, and is queued again,
// not answered "done" (which left the task running with no handler, for
// good: lost work in a failover run). The test resolves a batch of one
// Complete with the id of another transaction that committed; the
// Complete must then land.
func TestResolveChecksACommitAgainstTheTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	entered := make(chan *Run, 1)
	release := make(chan struct{})
	ir := startInternalRunner(t, map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error {
			entered <- run
			<-release // holds the run while the test writes its end
			return nil
		},
	}, nil)
	defer close(release)
	turn, _, err := ir.eng.Create(ctx, arbortype.CreateParams{ConversationID: ir.conv, Kind: "turn"})
	require.NoError(t, err)
	var run *Run
	select {
	case run = <-entered:
	case <-time.After(eventually):
		require.FailNow(t, "timed out waiting for the turn to run")
	}

	// The id of a transaction that committed, but not the batch's.
	tx, err := ir.pool.Begin(ctx)
	require.NoError(t, err)
	var other int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&other))
	require.NoError(t, tx.Commit(ctx))

	q := &queued{run: run, res: make(chan core.OutcomeResult, 1), o: core.Outcome{Kind: core.OutComplete,
		TaskID: turn.ID, Token: run.token, ConversationID: ir.conv, Result: []byte(`"resolved"`)}}
	require.False(t, ir.r.comp.resolve(ctx, []*queued{q}, other), "resolved by the check, not flushed anew as a whole")
	var res core.OutcomeResult
	select {
	case res = <-q.res:
	case <-time.After(eventually):
		require.FailNow(t, "timed out waiting for the Complete's result")
	}
	require.NoError(t, res.Err)
	got, err := ir.eng.Get(ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, got.Status, "the Complete landed: it was queued again, not answered done")
	require.JSONEq(t, `"resolved"`, string(got.Result))
}
