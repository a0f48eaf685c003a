package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestCheckFindsACorruptedDatabase corrupts two conversations with raw
// UPDATEs under a disabled guard trigger and runs check over each, over
// all, and over a third, healthy one.
func TestCheckFindsACorruptedDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)

	healthy := b.conv
	b.sampleTree(t)
	require.Equal(t, fmt.Sprintf("no violations (conversation %s)\n", healthy), b.arbor(t, "check", healthy).ok(t).stdout)
	require.Equal(t, fmt.Sprintf("no violations (every conversation of schema %s)\n", b.schema), b.arbor(t, "check").ok(t).stdout)

	// A completed task set back to running, with no token.
	b.conv = testdb.Conversation(t)
	revived := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	_, err := b.engine.Complete(b.ctx, revived.ID, revived.Token, nil)
	require.NoError(t, err)
	b.corrupt(t, `UPDATE {tasks} SET status = 'running' WHERE id = $1`, revived.ID)
	revivedConv := b.conv

	// A completed parent with a live child.
	b.conv = testdb.Conversation(t)
	parent := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	child := b.create(t, parent.ID, "tool", false)
	b.corrupt(t, `UPDATE {tasks} SET status = 'completed', token = NULL, lease_expires_at = NULL,
		settled_at = now(), settle_seq = nextval('`+b.schema+`.task_settle_seq') WHERE id = $1`, parent.ID)
	parentConv := b.conv

	r := b.arbor(t, "check", revivedConv)
	r.fails(t, 1, fmt.Sprintf("check: 3 invariant violations (conversation %s)", revivedConv))
	require.Equal(t, fmt.Sprintf(`invariant 1: conversation %[1]q task %[2]d: running with settled_at=%[3]s settle_seq=%[4]d
invariant 8: conversation %[1]q task %[2]d: running without a token or a task lease deadline
invariant 12: conversation %[1]q task %[2]d: running, but its newest status entry in the log says completed: a status change was not logged
`, revivedConv, revived.ID, settledAt(t, b, revived.ID), b.get(t, revived.ID).SettleSeq), r.stdout)

	r = b.arbor(t, "check", parentConv)
	r.fails(t, 1, "invariant violations")
	require.Contains(t, r.stdout, fmt.Sprintf("invariant 3: conversation %q task %d: completed with live foreground children [%d]", parentConv, parent.ID, child.ID))
	require.Contains(t, r.stdout, fmt.Sprintf("invariant 6: conversation %q task %d: live foreground child of completed owner %d", parentConv, child.ID, parent.ID))
	require.Contains(t, r.stdout, fmt.Sprintf("invariant 12: conversation %q task %d: completed, but its newest status entry in the log says running", parentConv, parent.ID))

	// Over every conversation: both broken ones, nothing of the healthy one.
	r = b.arbor(t, "check")
	r.fails(t, 1, fmt.Sprintf("(every conversation of schema %s)", b.schema))
	require.Contains(t, r.stdout, revivedConv)
	require.Contains(t, r.stdout, parentConv)
	require.NotContains(t, r.stdout, healthy)
	require.Equal(t, strings.Count(r.stdout, "\n"), strings.Count(r.stdout, "invariant "))

	// The healthy conversation still checks clean.
	b.arbor(t, "check", healthy).ok(t)
}

// settledAt is how the checker prints a task's settled_at (a *time.Time
// with %v).
func settledAt(t *testing.T, b *bundle, id int64) string {
	t.Helper()
	return fmt.Sprintf("%v", b.get(t, id).SettledAt)
}

func TestCheckCannotCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.arbor(t, "check", "no-such-conversation").fails(t, 2, `conversation "no-such-conversation" not found`)
	b.arbor(t, "check", "a", "b").fails(t, 2, `check: unexpected argument "b"`)
	runArbor(t, nil, "check").fails(t, 2, "no database")
}
