package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// arbor rerun runs the failed tool #3 again under its waiting turn: the
// rerun is new, names its source in tree and show, and takes the tool's
// place in the turn's wait; a second rerun of #3, a completed task and an
// unknown one are refused plainly.
func TestRerunFromTheCommandLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	out := b.arbor(t, "rerun", "3").ok(t).stdout
	require.Contains(t, out, `rerun #3 read_docs as #9, from phase "":`)
	require.Contains(t, out, "#9 read_docs: new → pending")
	tree := b.arbor(t, "tree", b.conv).ok(t).stdout
	require.Contains(t, tree, "#9 read_docs [pending] rerun of #3")
	require.Contains(t, tree, "#3 read_docs [failed]")
	require.Equal(t, []int64{2, 9, 4}, b.get(t, 1).WaitIDs, "the turn waits on the rerun now")
	require.Contains(t, b.arbor(t, "show", "9").ok(t).stdout, "#3 (run again from its checkpoint)")

	b.arbor(t, "rerun", "3").fails(t, 1, "it was rerun already, as task 9")
	b.arbor(t, "rerun", "2").fails(t, 1, "cannot rerun task 2: it is completed (rerun needs a task that is failed, aborted or cancelled)")
	b.arbor(t, "rerun", "9").fails(t, 1, "cannot rerun task 9: it is pending")
	b.arbor(t, "rerun", "99").fails(t, 1, "task 99 not found")
}
