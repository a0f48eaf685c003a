package store

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestLogGuardKeepsItsPlanAsTheTablesGrow (issue 42): the log's guard
// check (migration 006) is plain SQL, whose plan a session keeps from its
// first use. Made while the tables held a few rows (and their statistics
// said so), it must still look every row up by an index once they have
// grown — no statistics taken meanwhile (autovacuum is off on them): a session's statement that logs
// reads neither the tasks nor the log by a sequential scan.
func TestLogGuardKeepsItsPlanAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, s := blindSchema(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	create := func(conv string) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO `+schema+`.conversations (id) VALUES ($1)`, conv)
		require.NoError(t, err)
		_, err = s.InsertTask(ctx, conn, InsertParams{ConversationID: conv, Kind: "turn"})
		require.NoError(t, err)
	}
	// The session's plans, made over a few rows (more than PL/pgSQL's
	// custom plans before it settles on one).
	base := testdb.Conversation(t)
	create(base + "-first")
	for _, table := range []string{"tasks", "conversations", "conversation_log"} {
		_, err := conn.Exec(ctx, `ANALYZE `+schema+`.`+table)
		require.NoError(t, err)
	}
	for i := range 8 {
		create(fmt.Sprintf("%s-prime-%d", base, i))
	}
	const grown = 20_000
	withTriggersOff(t, pool,
		sqlArgs(`INSERT INTO `+schema+`.conversations (id) SELECT $1 || g FROM generate_series(1, $2::int) g`, base+"-grown-", grown),
		sqlArgs(`INSERT INTO `+schema+`.tasks (conversation_id, kind) SELECT $1 || g, 'turn' FROM generate_series(1, $2::int) g`, base+"-grown-", grown),
		sqlArgs(`INSERT INTO `+schema+`.conversation_log (conversation_id, task_id, kind, status, name)
			SELECT conversation_id, id, 'status', 'pending', kind FROM `+schema+`.tasks WHERE conversation_id LIKE $1 || '%'`, base+"-grown-"))

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The session's counts not yet reported (those of its earlier
	// transactions too): what the statement adds is the difference.
	var before int64
	seqScans := func() int64 {
		var n int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables
			WHERE schemaname = $1 AND relname IN ('tasks', 'conversation_log')`, s.Schema()).Scan(&n))
		return n - before
	}
	before = seqScans()
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.conversations (id) VALUES ($1)`, base+"-after")
	require.NoError(t, err)
	_, err = s.InsertTask(ctx, tx, InsertParams{ConversationID: base + "-after", Kind: "turn"})
	require.NoError(t, err)
	require.Zero(t, seqScans(), "the log's guard check read a grown table by a sequential scan")
}
