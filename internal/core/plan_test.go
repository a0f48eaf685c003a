package core_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Plans that must not depend on statistics (issue 24; the walks down a
// tree are checked statement by statement in internal/store/plan_test.go). A test
// here counts the rows of the tasks table its transaction read
// (pg_stat_xact_user_tables: rows of sequential scans and rows fetched
// through indexes, the guard's and the log trigger's statements included)
// and bounds them by a small multiple of the tasks the operation is about:
// a plan that reads unrelated tasks for every row reads millions of rows
// instead and fails, whatever the machine's speed.

// planBundle is a bundle on a schema of the test's own whose tables
// autovacuum leaves alone: statistics exist only where the test makes them.
func planBundle(t *testing.T) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	b := newBundle(t, pool, schema)
	for _, table := range []string{"tasks", "events", "conversation_log", "conversations"} {
		_, err := b.pool.Exec(b.ctx, `ALTER TABLE `+schema+`.`+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	return b
}

// tasksRead returns how many rows of the tasks table tx has read so far.
func (b *bundle) tasksRead(t *testing.T, tx pgx.Tx) int64 {
	t.Helper()
	var n int64
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_xact_user_tables WHERE relid = ($1 || '.tasks')::regclass`, b.schema).Scan(&n))
	return n
}

// TestForkBesideManyTasksReadsOnlyItsOwn: a fork of a settled turn of 201
// tasks, in a table that also holds 50,000 live tasks of another
// conversation, with statistics. The guard's check that the copy's
// conversation has nothing live, planned once for any conversation,
// scanned the whole table for every copied row (200,000 tasks beside a
// turn of 501: 5.4 s against 0.12 s).
func TestForkBesideManyTasksReadsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	other := newBundle(t, b.pool, b.schema)
	_, _, err := other.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: other.conv, Kind: "x"})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO `+b.schema+`.tasks (conversation_id, kind) SELECT $1, 'x' FROM generate_series(1, 50000)`, other.conv)
	require.NoError(t, err)
	root, total := bigTree(t, b, []int{200}, 0)
	_, err = b.engine.Abort(b.ctx, root.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `ANALYZE `+b.schema+`.tasks`)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	start := b.tasksRead(t, tx)
	f, err := b.engine.ForkTx(b.ctx, tx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: root.ID})
	require.NoError(t, err)
	require.EqualValues(t, total, f.Tasks)
	read := b.tasksRead(t, tx) - start
	t.Logf("fork of %d tasks read %d rows of tasks", total, read)
	require.Less(t, read, int64(20*total), "rows read per task copied: %d", read/int64(total))
	require.NoError(t, tx.Commit(b.ctx))
	vs, err := b.engine.Check(b.ctx, f.ConversationID)
	require.NoError(t, err)
	require.Empty(t, vs)
	// The 50,000 pending tasks stay: the schema is the test's own
	// (testdb.Fresh). Aborting them took one transaction whose client,
	// under the race detector on a loaded machine, spent over the engine's
	// IdleInTransaction (5 s) between two statements, and the server ended
	// its session: a cost of the test's setting, not what it measures.
}

// TestAbortInASessionThatLoggedOnATinyTable (issue 38): an abort of 5,000
// children by an engine whose one connection first wrote log entries
// while the tasks table held a few rows (a new database), analysed then
// and never again (autovacuum off): the abort's transaction reads a
// number of tasks rows linear in the subtree. The log's INSERT check was
// a static statement of its PL/pgSQL function, planned once per session:
// that session kept a sequential scan of tasks for each new entry, and an
// abort of 10,000 children took a minute (seconds after ANALYZE, which
// drops the cached plans). Migration 034 plans it per statement.
func TestAbortInASessionThatLoggedOnATinyTable(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	one := testdb.SmallPool(t, 1)
	b.engine = enginetest.New(t, one, &tasks.Config{Schema: b.schema})
	warm := newBundle(t, b.pool, b.schema)
	warm.engine = b.engine
	warm.root(t, "w")
	_, err := b.pool.Exec(b.ctx, `ANALYZE `+b.schema+`.tasks`)
	require.NoError(t, err)
	for range 8 {
		r := warm.root(t, "w")
		_, err := warm.engine.Abort(b.ctx, r.ID)
		require.NoError(t, err)
	}
	root, total := bigTree(t, b, []int{5000}, 0)

	tx, err := one.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	start := b.tasksRead(t, tx)
	rep, err := b.engine.AbortTx(b.ctx, tx, root.ID)
	require.NoError(t, err)
	require.Len(t, rep.Settled, total)
	read := b.tasksRead(t, tx) - start
	t.Logf("abort of %d tasks read %d rows of tasks", total, read)
	require.Less(t, read, int64(20*total), "rows read per task aborted: %d", read/int64(total))
	require.NoError(t, tx.Commit(b.ctx))
}
