package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
)

// TestClaimKeepsItsPlanAfterASettledHistory (issue 20, "cost per task flat
// as the tables grow"): statistics taken over a settled history (nothing
// pending, no conversation held) must not make the claim scan every
// pending task and join each to every conversation of the holder, as it
// did (bench (l): 2,546 µs of server CPU per task after 1,000,000 settled
// tasks, against 96 fresh). The claim's work stays linear in the
// conversations it claims in.
func TestClaimKeepsItsPlanAfterASettledHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	s, err := New(schema)
	require.NoError(t, err)
	for _, table := range []string{"tasks", "conversations", "holders"} {
		_, err := pool.Exec(ctx, `ALTER TABLE `+s.Schema()+`.`+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	// The history, written with the guard off (rows a runner would have
	// taken minutes to make), then analyzed.
	const history, live = 5000, 300
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err, "the test writes its history with triggers off (a superuser's session_replication_role)")
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.conversations (id) SELECT 'hist-' || g FROM generate_series(1, $1) g`, history)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, kind, status, started_at, settled_at)
		SELECT 'hist-' || g, 'noop', 'completed', now(), now() FROM generate_series(1, $1) g`, history)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = pool.Exec(ctx, `ANALYZE `+schema+`.tasks, `+schema+`.conversations, `+schema+`.holders`)
	require.NoError(t, err)

	// Now a node holds live conversations, each with a pending turn.
	var holder int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+schema+`.holders (name, expires_at) VALUES ('node', now() + interval '1 hour') RETURNING id`).Scan(&holder))
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.conversations (id, holder, holder_id, epoch)
		SELECT 'live-' || g, 'node', $2, 1 FROM generate_series(1, $1) g`, live, holder)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, kind) SELECT 'live-' || g, 'noop' FROM generate_series(1, $1) g`, live)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	convs := make([]string, live)
	for i := range convs {
		convs[i] = fmt.Sprintf("live-%d", i+1)
	}

	// The claim, explained and run in a transaction rolled back.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+s.sql[qClaimIn],
		holder, convs, nil, nil, 1000, string(arbortype.StatusRunning), micros(60e9)).Scan(&plan))
	work := planWork(t, plan)
	t.Logf("the claim in %d held conversations after %d settled tasks: plan work %.0f", live, history, work)
	require.LessOrEqual(t, work, float64(40*live), "the claim's plan is linear in the conversations it claims in:\n%s", plan)
}

// TestClaimOfAnExpiredHolderClaimsNothing: a claim sent under a holder
// row that has expired (a process resumed from a freeze, before its fence
// on its own clock fired) claims nothing, although the conversation still
// names that holder: the taker would otherwise count the run it started as
// a restart.
func TestClaimOfAnExpiredHolderClaimsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	s, err := New(schema)
	require.NoError(t, err)
	for _, live := range []bool{true, false} {
		var holder int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+schema+`.holders (name, expires_at)
			VALUES ('node', now() + CASE WHEN $1 THEN interval '1 hour' ELSE interval '-1 second' END) RETURNING id`, live).Scan(&holder))
		conv := fmt.Sprintf("%s-%v", testdb.Conversation(t), live)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.conversations (id, holder, holder_id, epoch) VALUES ($1, 'node', $2, 1)`, conv, holder)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, kind) VALUES ($1, 'noop')`, conv)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))

		claimed, _, err := s.ClaimIn(ctx, pool, holder, []string{conv}, nil, nil, 10, arbortype.StatusRunning, time.Minute)
		require.NoError(t, err)
		if live {
			require.Len(t, claimed, 1, "a live holder claims its conversation's task")
		} else {
			require.Empty(t, claimed, "an expired holder claims nothing")
		}
	}
}
