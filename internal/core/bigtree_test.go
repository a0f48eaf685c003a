package core_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// bigTree builds, with bulk SQL (setup only: every row goes through the
// guard trigger, as pending inserts and pending -> running starts), a tree
// under one running root: fanout[i] children for each node of depth i, so
// len(fanout) levels below the root. Every third node is started, and each
// node of depth bgDepth (if > 0) gets a background child with a child of
// its own. It returns the root and the number of foreground tasks.
func bigTree(tb testing.TB, b *bundle, fanout []int, bgDepth int) (arbortype.Task, int) {
	tb.Helper()
	root, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "L0"})
	require.NoError(tb, err)
	total := 1
	for depth, n := range fanout {
		tag, err := b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %[1]s.tasks (conversation_id, owner_task_id, kind)
			SELECT conversation_id, id, 'L%[2]d' FROM %[1]s.tasks, generate_series(1, $2)
			WHERE conversation_id = $1 AND kind = 'L%[3]d' ORDER BY id`, b.schema, depth+1, depth), b.conv, n)
		require.NoError(tb, err)
		total += int(tag.RowsAffected())
		if depth+1 == bgDepth {
			_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %[1]s.tasks (conversation_id, owner_task_id, kind, background)
				SELECT conversation_id, id, 'BG', true FROM %[1]s.tasks WHERE conversation_id = $1 AND kind = 'L%[2]d' ORDER BY id`, b.schema, depth+1), b.conv)
			require.NoError(tb, err)
			_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`INSERT INTO %[1]s.tasks (conversation_id, owner_task_id, kind)
				SELECT conversation_id, id, 'BGK' FROM %[1]s.tasks WHERE conversation_id = $1 AND kind = 'BG' ORDER BY id`, b.schema), b.conv)
			require.NoError(tb, err)
		}
	}
	lease := b.lease(tb)
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`UPDATE %[1]s.tasks SET status = 'running', started_at = now(),
		token = nextval('%[1]s.task_token_seq'), run_epoch = $3, lease_expires_at = now() + interval '1 hour'
		WHERE conversation_id = $1 AND (id %% 3 = 0 OR id = $2)`, b.schema), b.conv, root.ID, lease.Epoch)
	require.NoError(tb, err)
	return b.get(tb, root.ID), total
}

// TestAbortTenThousandTasks: a tree of depth 10 with about 10,000 tasks,
// aborted at the root: every descendant settled, every child before its
// parent (the invariant checker verifies settle order), background
// subtrees untouched.
func TestAbortTenThousandTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 1, 3, 9, …, 2187 nodes down to depth 7, then single chains to depth 10.
	root, total := bigTree(t, b, []int{3, 3, 3, 3, 3, 3, 3, 1, 1, 1}, 3)
	require.Equal(t, 9841, total)

	rep, err := b.engine.Abort(b.ctx, root.ID)
	require.NoError(t, err)
	require.Len(t, rep.Settled, total)
	require.Equal(t, root.ID, rep.Settled[len(rep.Settled)-1].ID, "the target settles last")

	var live, bgLive, orphaned, aborted int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
		count(*) FILTER (WHERE status IN ('pending','running') AND kind NOT IN ('BG','BGK')),
		count(*) FILTER (WHERE status IN ('pending','running') AND kind IN ('BG','BGK')),
		count(*) FILTER (WHERE status = 'orphaned'),
		count(*) FILTER (WHERE status = 'aborted')
		FROM `+b.schema+`.tasks WHERE conversation_id = $1`, b.conv).Scan(&live, &bgLive, &orphaned, &aborted))
	require.Zero(t, live)
	require.Equal(t, 2*27, bgLive, "background subtrees untouched")
	require.Equal(t, total, orphaned+aborted)
	require.NotZero(t, orphaned)
	require.NotZero(t, aborted)

	// Children before parents, checked on the whole tree.
	var wrong int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.schema+`.tasks c
		JOIN `+b.schema+`.tasks p ON p.id = c.owner_task_id
		WHERE c.conversation_id = $1 AND NOT c.background AND c.settle_seq > p.settle_seq`, b.conv).Scan(&wrong))
	require.Zero(t, wrong)
	b.requireInvariants(t)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusAborted, b.get(t, root.ID).Status)
}
