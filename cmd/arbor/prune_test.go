package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// prune --dry-run prints what prune then deletes; fork prints the copy's
// id and refuses a live turn in one line.
func TestPruneAndFork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var turns []int64
	for range 2 {
		turn := b.create(t, 0, "chat_turn", false)
		_, err := b.engine.Cancel(b.ctx, turn.ID, nil)
		require.NoError(t, err)
		turns = append(turns, turn.ID)
	}
	live := b.create(t, 0, "chat_turn", false)

	dry := b.arbor(t, "prune", "--older-than", "1ns", "--dry-run").ok(t).stdout
	require.True(t, strings.HasPrefix(dry, "would prune (settled before 0s ago): 0 conversations whole, 1 turns, 1 tasks, 0 events, 2 log entries, 0 wake jobs\n"), dry)
	done := b.arbor(t, "prune", "--older-than", "1ns").ok(t).stdout
	require.Equal(t, strings.Replace(dry, "would prune", "pruned", 1), done)
	_, err := b.engine.Get(b.ctx, turns[0])
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	out := b.arbor(t, "fork", b.conv, fmt.Sprint(turns[1]), "--new", "edited").ok(t).stdout
	require.Equal(t, fmt.Sprintf("forked %s through turn #%d into edited: 1 tasks, 0 events, 2 log entries\n", b.conv, turns[1]), out)
	b.arbor(t, "fork", b.conv, fmt.Sprint(live.ID)).fails(t, 1, "is still live")
	b.arbor(t, "prune").fails(t, 1, "--older-than is required")
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}
