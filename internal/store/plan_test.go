package store

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
)

// planWork is the work a plan did, from EXPLAIN (ANALYZE, FORMAT JSON):
// over every node, the rows it returned and the rows its filters and join
// filters threw away, times its loops (EXPLAIN gives them per loop). A
// nested loop that compares every task of a walk's work table with every
// task of the conversation shows here as tens of millions, whatever the
// machine's speed.
func planWork(t *testing.T, plan []byte) float64 {
	t.Helper()
	w := 0.0
	planNodes(t, plan, func(num func(string) float64) {
		w += (num("Actual Rows") + num("Rows Removed by Filter") + num("Rows Removed by Join Filter")) * num("Actual Loops")
	})
	return w
}

// planMaxLoops is the most loops of any node of a plan from EXPLAIN
// (ANALYZE, FORMAT JSON): a node run once per row of something the
// statement did not ask for (every conversation a holder holds) shows
// here, however few rows each loop finds.
func planMaxLoops(t *testing.T, plan []byte) float64 {
	t.Helper()
	m := 0.0
	planNodes(t, plan, func(num func(string) float64) { m = max(m, num("Actual Loops")) })
	return m
}

// planNodes calls node with each node of a plan from EXPLAIN (FORMAT
// JSON), given as a reader of its numeric fields.
func planNodes(t *testing.T, plan []byte, node func(num func(string) float64)) {
	t.Helper()
	var top []struct {
		Plan map[string]any `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(plan, &top))
	require.Len(t, top, 1)
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		node(func(k string) float64 { v, _ := n[k].(float64); return v })
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(top[0].Plan)
}

// jitAboveCost is PostgreSQL's default jit_above_cost: a plan estimated
// to cost more is compiled by its JIT (when the server has one), which
// takes hundreds of milliseconds, for a statement whose work is a few.
const jitAboveCost = 100_000.0

// planCost is a plan's estimated total cost, from EXPLAIN (FORMAT JSON).
func planCost(t *testing.T, plan []byte) float64 {
	t.Helper()
	var top []struct {
		Plan struct {
			TotalCost float64 `json:"Total Cost"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(plan, &top))
	require.Len(t, top, 1)
	return top[0].Plan.TotalCost
}

// explainRolledBack runs sql with EXPLAIN (ANALYZE, FORMAT JSON) in a
// transaction it rolls back, and returns the plan.
func explainRolledBack(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []byte {
	t.Helper()
	return explainIn(t, pool, "auto", sql, args...)
}

// explainGeneric is explainRolledBack of the generic plan: the one a
// prepared statement (pgx's statement cache) settles on after five runs
// when it costs no more than the custom ones, planned without the
// parameters' values.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []byte {
	t.Helper()
	return explainIn(t, pool, "force_generic_plan", sql, args...)
}

func explainIn(t *testing.T, pool *pgxpool.Pool, mode, sql string, args ...any) []byte {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
	require.NoError(t, err)
	var plan []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&plan), sql)
	return plan
}

// statement is a statement and its arguments, for withTriggersOff.
type statement struct {
	sql  string
	args []any
}

func sqlArgs(sql string, args ...any) statement { return statement{sql, args} }

// withTriggersOff runs the statements in one transaction with the
// triggers off (a superuser's session_replication_role, as a restore
// would): rows a runner would take minutes to make, or states the guards
// would refuse, written at once.
func withTriggersOff(t *testing.T, pool *pgxpool.Pool, stmts ...statement) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err, "the test writes with the triggers off (a superuser's session_replication_role)")
	for _, st := range stmts {
		_, err = tx.Exec(ctx, st.sql, st.args...)
		require.NoError(t, err, st.sql)
	}
	require.NoError(t, tx.Commit(ctx))
}

// blindSchema is a fresh schema whose tables autovacuum never analyses:
// their statistics are what the test takes, or none.
func blindSchema(t *testing.T) (*pgxpool.Pool, string, *Store) {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	s, err := New(schema)
	require.NoError(t, err)
	for _, table := range []string{"tasks", "conversations", "conversation_log", "events", "holders"} {
		_, err := pool.Exec(context.Background(), `ALTER TABLE `+s.Schema()+`.`+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	return pool, schema, s
}

// fanOut inserts conversation conv with a root task and children pending
// children of it, and returns the root's id.
func fanOut(t *testing.T, pool *pgxpool.Pool, schema, conv string, children int) int64 {
	t.Helper()
	ctx := context.Background()
	var root int64
	require.NoError(t, pool.QueryRow(ctx, `WITH c AS (INSERT INTO `+schema+`.conversations (id) VALUES ($1))
		INSERT INTO `+schema+`.tasks (conversation_id, kind) VALUES ($1, 'root') RETURNING id`, conv).Scan(&root))
	_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, owner_task_id, kind)
		SELECT $1, $2, 'child' FROM generate_series(1, $3)`, conv, root, children)
	require.NoError(t, err)
	return root
}

// TestTreeWalksKeepTheirPlanWithoutStatistics (issue 24): the walks down a
// tree (the abort's, the fork's, the prune's) right after a fan-out of
// 3,000 children, before any statistics of the table exist (autovacuum is
// off on it): each does work linear in the tree. Planned blind, the plain
// recursive join compared every task of the work table with every task of
// the conversation: 10,001 tasks took 14.7 s to lock for an abort, against
// 33 ms so (internal/store/tree.go).
func TestTreeWalksKeepTheirPlanWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, s := blindSchema(t)
	const children = 3000
	conv := testdb.Conversation(t)
	root := fanOut(t, pool, schema, conv, children)
	const total = children + 1

	explain := func(t *testing.T, db DB, q query, args ...any) float64 {
		t.Helper()
		var plan []byte
		require.NoError(t, db.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql[q], args...).Scan(&plan))
		return planWork(t, plan)
	}
	// The abort's walk over the live tree.
	work := explain(t, pool, qLiveSubtreeIDs, []int64{root}, conv)
	t.Logf("walk of %d live tasks: work %.0f", total, work)
	assert.Less(t, work, float64(20*total), "the abort's walk")

	// The tree settled (the abort's own bulk settle, leaves first), for
	// the fork's and the prune's walks.
	ids, statuses := make([]int64, 0, total), make([]arbortype.Status, 0, total)
	rows, err := pool.Query(ctx, `SELECT id FROM `+schema+`.tasks WHERE conversation_id = $1 ORDER BY id DESC`, conv)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	for _, id := range got {
		ids, statuses = append(ids, id), append(statuses, arbortype.StatusAborted)
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := s.AbortMany(ctx, tx, conv, ids, statuses, nil, nil)
		return err
	}))
	work = explain(t, pool, qForkSource, conv, root)
	t.Logf("fork source of %d tasks: work %.0f", total, work)
	assert.Less(t, work, float64(20*total), "the fork's walk")
	work = explain(t, pool, qPruneVictims, conv, time.Now().Add(time.Hour), 1_000_000)
	t.Logf("prune victims of %d tasks: work %.0f", total, work)
	assert.Less(t, work, float64(20*total), "the prune's walk")
}

// TestAbortStatementsKeepTheirPlanWithStaleStatistics (issues 24 and
// 38): an abort's statements over a live tree right after a fan-out of
// 3,000 children, in a table that also holds 20,000 tasks of another
// conversation, with the table's statistics taken before the fan-out: the
// walk, the lock of a chunk of ids and the settle of a chunk each do work
// linear in what they are given, never in the table. With statistics
// taken before a fan-out, the lock of the walked ids was planned as a
// nested loop that compared every task of the walk with every task of the
// conversation (the audit: 28.8 s for 10,001 tasks, 0.59 s after
// ANALYZE), and the settle, "FROM unnest(ids) WHERE t.id = v.task_id", as
// a hash join over a sequential scan of every task of the table, for each
// statement of an abort.
func TestAbortStatementsKeepTheirPlanWithStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, s := blindSchema(t)
	fanOut(t, pool, schema, testdb.Conversation(t), 20_000)
	_, err := pool.Exec(ctx, `ANALYZE `+schema+`.tasks`)
	require.NoError(t, err)
	const children = 3000
	conv := testdb.Conversation(t)
	root := fanOut(t, pool, schema, conv, children)
	const total = children + 1

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	explain := func(q query, args ...any) float64 {
		t.Helper()
		var plan []byte
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql[q], args...).Scan(&plan))
		return planWork(t, plan)
	}
	work := explain(qLiveSubtreeIDs, []int64{root}, conv)
	t.Logf("walk of %d live tasks over stale statistics: work %.0f", total, work)
	assert.Less(t, work, float64(20*total), "the abort's walk")

	ids, err := s.LiveSubtreeIDs(ctx, tx, conv, []int64{root})
	require.NoError(t, err)
	require.Len(t, ids, total)
	const chunk = 500
	leaves := ids[len(ids)-chunk:]
	work = explain(qLockLiveTasks, leaves, conv)
	t.Logf("lock of %d live tasks over stale statistics: work %.0f", chunk, work)
	assert.Less(t, work, float64(20*chunk), "the abort's lock of a chunk")
	_, err = s.LockLiveTasks(ctx, tx, conv, leaves)
	require.NoError(t, err)

	desc := slices.Clone(leaves)
	slices.Reverse(desc)
	statuses := make([]string, len(desc))
	for i := range statuses {
		statuses[i] = string(arbortype.StatusOrphaned)
	}
	work = explain(qSettleMany, desc, statuses, []int64{}, nil, conv)
	t.Logf("settle of %d tasks over stale statistics: work %.0f", chunk, work)
	assert.Less(t, work, float64(20*chunk), "the abort's settle of a chunk")
}

// TestTreeWalksUpKeepTheirPlanWithoutStatistics (issue 24): the walks up
// a tree (a reservation's scope chain, the budgets a task's page shows)
// from a task 40 levels under one of 3,000 siblings, before any statistics
// of the table exist, and again after ANALYZE: each does work linear in
// the depth. Planned blind, the plain recursive join hashed the whole
// conversation at every level: 250,000 rows for a chain of 42.
func TestTreeWalksUpKeepTheirPlanWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	s, err := New(schema)
	require.NoError(t, err)
	for _, table := range []string{"tasks", "conversations", "budgets"} {
		_, err := pool.Exec(ctx, `ALTER TABLE `+s.Schema()+`.`+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	const siblings, depth = 3000, 40
	conv := testdb.Conversation(t)
	var root, leaf int64
	require.NoError(t, pool.QueryRow(ctx, `WITH c AS (INSERT INTO `+schema+`.conversations (id) VALUES ($1))
		INSERT INTO `+schema+`.tasks (conversation_id, kind) VALUES ($1, 'root') RETURNING id`, conv).Scan(&root))
	require.NoError(t, pool.QueryRow(ctx, `WITH kids AS (INSERT INTO `+schema+`.tasks (conversation_id, owner_task_id, kind)
		SELECT $1, $2, 'child' FROM generate_series(1, $3) RETURNING id) SELECT max(id) FROM kids`, conv, root, siblings).Scan(&leaf))
	for range depth {
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, owner_task_id, kind)
			VALUES ($1, $2, 'deep') RETURNING id`, conv, leaf).Scan(&leaf))
	}
	// A budget of the root's subtree, so that the page's read walks.
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.budgets (conversation_id, task_id, counter, max) VALUES ($1, $2, 'tokens', 10)`, conv, root)
	require.NoError(t, err)
	const chain = depth + 2 // the leaf, its owners, the root

	explain := func(t *testing.T, q query, args ...any) float64 {
		t.Helper()
		var plan []byte
		require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql[q], args...).Scan(&plan))
		return planWork(t, plan)
	}
	for _, stats := range []string{"without statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			_, err := pool.Exec(ctx, `ANALYZE `+schema+`.tasks, `+schema+`.budgets`)
			require.NoError(t, err)
		}
		work := explain(t, qScopeChain, conv, leaf)
		t.Logf("%s: scope chain of %d: work %.0f", stats, chain, work)
		assert.Less(t, work, float64(20*chain), "the scope chain, %s", stats)
		work = explain(t, qTaskBudgets, conv, leaf)
		t.Logf("%s: budgets of the chain of %d: work %.0f", stats, chain, work)
		assert.Less(t, work, float64(20*chain), "the budgets of a task, %s", stats)
	}
}

// TestForkOfADeepChainIsLinear (issue 38): a fork of a settled chain
// 10,000 tasks deep, each waiting on its child, with two log entries each
// naming its owner, without statistics: each statement of the fork does
// work linear in the chain. Each copy's owner, waited tasks and delivered
// event, and each log entry's owner, were looked up by a pass over every
// pair of old and new ids, once per copied row (a fork of such a chain
// took 49 s, over 60 s in another run).
func TestForkOfADeepChainIsLinear(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, s := blindSchema(t)
	const depth = 10_000
	const total = depth + 1
	conv := testdb.Conversation(t)
	var first, firstSettle int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'id')), nextval($2::regclass)`,
		schema+".tasks", schema+".task_settle_seq").Scan(&first, &firstSettle))
	withTriggersOff(t, pool,
		sqlArgs(`SELECT setval(pg_get_serial_sequence($1, 'id'), $2), setval($3::regclass, $4)`,
			schema+".tasks", first+total, schema+".task_settle_seq", firstSettle+total),
		sqlArgs(`INSERT INTO `+schema+`.conversations (id) VALUES ($1)`, conv),
		// Leaves first: the deepest task settled first.
		sqlArgs(`INSERT INTO `+schema+`.tasks (id, conversation_id, owner_task_id, kind, status, abort_requested,
				started_at, settled_at, settle_seq, wait_policy, wait_ids)
			OVERRIDING SYSTEM VALUE
			SELECT $2 + i, $1, CASE WHEN i > 0 THEN $2 + i - 1 END, 'deep', 'aborted', true, now(), now(), $3 + $4 - i,
				CASE WHEN i < $4 THEN 'all_settled' END, CASE WHEN i < $4 THEN ARRAY[$2 + i + 1] END
			FROM generate_series(0, $4::bigint) i ORDER BY i`, conv, first, firstSettle, depth),
		sqlArgs(`INSERT INTO `+schema+`.conversation_log (conversation_id, task_id, kind, status, name, payload)
			SELECT conversation_id, id, 'status', st, kind, jsonb_strip_nulls(jsonb_build_object('owner', owner_task_id))
			FROM `+schema+`.tasks, unnest(ARRAY['pending', 'aborted']) st WHERE conversation_id = $1
			ORDER BY st DESC, id`, conv))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	explain := func(what string, q query, args ...any) {
		t.Helper()
		var plan []byte
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql[q], args...).Scan(&plan))
		work := planWork(t, plan)
		t.Logf("%s of a chain of %d: work %.0f", what, total, work)
		assert.Less(t, work, float64(20*total), what)
	}
	explain("the fork's walk", qForkSource, conv, first)
	to := testdb.Conversation(t)
	ok, err := s.InsertForkConversation(ctx, tx, to, conv)
	require.NoError(t, err)
	require.True(t, ok)
	old := make([]int64, total)
	for i := range old {
		old[i] = first + int64(i)
	}
	explain("the events' lookup", qForkEvents, conv, old)
	ids, err := s.sequence(ctx, tx, qNextTaskIDs, total)
	require.NoError(t, err)
	settles, err := s.sequence(ctx, tx, qNextSettles, total)
	require.NoError(t, err)
	slices.Reverse(settles) // the sources settled leaves first
	none := []int64{}
	explain("the copy of the tasks", qInsertForkTasks, to, old, ids, settles, none, none)
	explain("the copy of the log", qInsertForkLog, to, conv, old, ids, none, none)
	var copied, waits, owners int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c.wait_ids = ARRAY[c.id + 1]),
			count(*) FILTER (WHERE c.owner_task_id = c.id - 1)
		FROM `+schema+`.tasks c WHERE c.conversation_id = $1`, to).Scan(&copied, &waits, &owners))
	require.Equal(t, total, copied)
	require.Equal(t, depth, waits, "each copy waits on its child's copy")
	require.Equal(t, depth, owners, "each copy is owned by its owner's copy")
	var logged, named int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE (l.payload->>'owner')::bigint = t.owner_task_id)
		FROM `+schema+`.conversation_log l JOIN `+schema+`.tasks t ON t.id = l.task_id WHERE l.conversation_id = $1`, to).Scan(&logged, &named))
	require.Equal(t, 2*total, logged)
	require.Equal(t, 2*depth, named, "each copied entry names its owner's copy")
	// The commit's check that each copy waits on the copies of its
	// source's waited tasks (the schema baseline), run now.
	_, err = tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`)
	require.NoError(t, err)
}
