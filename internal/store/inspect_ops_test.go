package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOperatorReadsAreBounded (issue 41): the web view's operator reads
// (inspect_ops.sql) over 100,000 conversations — a third of their turns
// settled in the last hour, some failed, the rest pending or running,
// across five tenants — and a conversation of 100,000 tasks do work
// bounded by what they are asked for (a page of conversations, the scan,
// the depth), never by the table: each plan's work (rows returned and
// thrown away, over every node) is checked, and its time logged.
func TestOperatorReadsAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, s := blindSchema(t)
	const n = 100_000
	sc := s.Schema()
	withTriggersOff(t, pool,
		sqlArgs(`INSERT INTO `+sc+`.conversations (id, tenant) SELECT 'c-' || lpad(i::text, 6, '0'), 't' || (i % 5) FROM generate_series(1, $1) i`, n),
		sqlArgs(`INSERT INTO `+sc+`.tasks (conversation_id, tenant, kind, status, created_at, queue_at, started_at, settled_at)
			SELECT 'c-' || lpad(i::text, 6, '0'), 't' || (i % 5), 'turn',
				CASE i % 3 WHEN 0 THEN CASE WHEN i % 7 = 0 THEN 'failed' ELSE 'completed' END WHEN 1 THEN 'pending' ELSE 'running' END,
				now() - (i % 3600) * interval '1 second', now() - (i % 3600) * interval '1 second',
				CASE WHEN i % 3 <> 1 THEN now() - (i % 3600) * interval '1 second' END,
				CASE WHEN i % 3 = 0 THEN now() - (i % 3000) * interval '1 second' END
			FROM generate_series(1, $1) i`, n),
		sqlArgs(`INSERT INTO `+sc+`.conversations (id) VALUES ('tree')`),
		sqlArgs(`INSERT INTO `+sc+`.tasks (conversation_id, kind, status, started_at) VALUES ('tree', 'turn', 'running', now())`),
		sqlArgs(`INSERT INTO `+sc+`.tasks (conversation_id, owner_task_id, kind)
			SELECT 'tree', (SELECT id FROM `+sc+`.tasks WHERE conversation_id = 'tree'), 'tool' FROM generate_series(2, $1)`, n),
	)
	// As autovacuum leaves them: analysed, and the visibility map set.
	for _, table := range []string{"tasks", "conversations"} {
		_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+sc+`.`+table)
		require.NoError(t, err)
	}

	explain := func(name string, q query, most float64, args ...any) {
		t.Helper()
		began := time.Now()
		plan := explainRolledBack(t, pool, s.sql[q], args...)
		work := planWork(t, plan)
		t.Logf("%s: work %.0f, %v (EXPLAIN ANALYZE)", name, work, time.Since(began).Round(time.Millisecond))
		if !assert.Less(t, work, most, "%s", name) {
			rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+s.sql[q], args...)
			require.NoError(t, err)
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				t.Log(line)
			}
			rows.Close()
		}
	}
	page := make([]string, 50)
	for i := range page {
		page[i] = fmt.Sprintf("c-%06d", n-i)
	}
	explain("ConversationStates, a page of 50", qConversationStates, 2_000, page, time.Minute.Microseconds(), 10_000)
	// The tree's 100,000 live tasks are read along the live index: work
	// in its live tasks (as the listing's own live counts), not the table.
	explain("ConversationStates, the 100,000-task tree", qConversationStates, 6*n, []string{"tree"}, time.Minute.Microseconds(), 10_000)
	explain("LiveRootIDs, the tree", qLiveRootIDs, 3*n, "tree", 1000)
	explain("AwaitContexts, 50 ids", qAwaitContexts, 500, []int64{1, 2, 3, 50, 5000, 99_999}, 1024)
	// A third of 100,000 turns settled in the hour: a range of the settled
	// roots' index, the hour's (the planner may read it whole, by bitmap,
	// and keep the newest scan of them), never the table.
	explain("SettledTurnsPerMinute, scan 10,000", qSettledTurnsPerMinute, 4*n/3, time.Hour.Microseconds(), 10_000)
	explain("SettledTurnsPerMinute, scan 100,000", qSettledTurnsPerMinute, 6*n/3, time.Hour.Microseconds(), 100_000)
	// The newest scan tasks, along the primary key: linear in the scan.
	explain("StartedTurnsPerMinute, scan 10,000", qStartedTurnsPerMinute, 5*10_000, time.Hour.Microseconds(), 10_000)
	explain("StartedTurnsPerMinute, scan 100,000", qStartedTurnsPerMinute, 5*n, time.Hour.Microseconds(), 100_000)
	// Six tenants ('' the tree's): a probe each, and each pending count
	// up to the depth.
	explain("PendingByTenant, depth 10,000", qPendingByTenant, 6*3*10_000, 101, 10_000)
	_, err := s.PendingByTenant(ctx, pool, 101, 10_000)
	require.NoError(t, err)
}
