package core_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestXactCommittedKnowsAnIDTheServerNeverGaveOut: XactCommitted resolves
// a commit whose answer was lost by the transaction's id. A committed id
// is committed and a rolled-back one is not; an id past the server's next
// one — what a failover's new primary sees of a transaction whose records
// never reached it — did not commit there: false, not an error (the
// completer retried that error forever, and its lane stalled, in a
// failover run).
func TestXactCommittedKnowsAnIDTheServerNeverGaveOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	idOf := func(commit bool) int64 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		var id int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&id))
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return id
	}
	committed, rolledBack := idOf(true), idOf(false)

	got, err := core.XactCommitted(ctx, e.C, committed)
	require.NoError(t, err)
	require.True(t, got, "a committed transaction")
	got, err = core.XactCommitted(ctx, e.C, rolledBack)
	require.NoError(t, err)
	require.False(t, got, "a rolled-back transaction")
	got, err = core.XactCommitted(ctx, e.C, committed+1_000_000_000)
	require.NoError(t, err, "an id the server never gave out is an answer, not a fault")
	require.False(t, got, "nothing of a transaction the server never saw is in its database")
}
