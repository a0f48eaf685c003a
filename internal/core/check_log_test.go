package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
)

// TestCheckerFindsAnUnloggedStatus: a status change the guard allows but
// no arbor statement made (a hand-written UPDATE, which nothing logs since
// the log is written by arbor's own statements) leaves the task's newest
// status entry behind its status: invariant 12.
func TestCheckerFindsAnUnloggedStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conv := testdb.Conversation(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	vs, err := b.engine.Check(b.ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs, "arbor's own insert is logged")

	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET status = 'cancelled', error = '{"code": "by_hand"}',
		settled_at = now(), settle_seq = nextval('`+b.schema+`.task_settle_seq'), updated_at = now() WHERE id = $1`, task.ID)
	require.NoError(t, err, "pending > cancelled is an edge: the guard lets it by")
	vs, err = b.engine.Check(b.ctx, conv)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	require.Equal(t, 12, vs[0].Invariant)
	require.Equal(t, task.ID, vs[0].TaskID)
	require.Contains(t, vs[0].Message, "newest status entry in the log")

	// An entry written afterwards is not the change's own: refused
	// (issue 38: it let a second `completed` in for a task
	// settled long ago), and the violation stays.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO `+b.schema+`.conversation_log (conversation_id, task_id, kind, status, name)
		VALUES ($1, $2, 'status', 'cancelled', 'turn')`, conv, task.ID)
	requireSQLState(t, err, guardrules.SQLStateRecord)
	vs, err = b.engine.Check(b.ctx, conv)
	require.NoError(t, err)
	require.Len(t, vs, 1)

	// Logged as arbor logs it, by the statement that changes the status,
	// the log agrees.
	other, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `WITH w AS (UPDATE `+b.schema+`.tasks SET status = 'cancelled', error = '{"code": "by_hand"}',
			settled_at = now(), settle_seq = nextval('`+b.schema+`.task_settle_seq'), updated_at = now() WHERE id = $2 RETURNING *)
		INSERT INTO `+b.schema+`.conversation_log (conversation_id, task_id, kind, status, name, payload)
		SELECT $1, w.id, 'status', w.status, w.kind, '{"error": "by_hand"}' FROM w`, conv, other.ID)
	require.NoError(t, err)
	vs, err = b.engine.Check(b.ctx, conv)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	require.Equal(t, task.ID, vs[0].TaskID, "only the unlogged change")
}
