package fsm_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/fsm"
)

// design is DESIGN §2 written out by hand, row by row, so that a change to
// the table in fsm.go that the contract does not have fails here.
var design = map[fsm.Status]map[fsm.Event]fsm.Status{
	fsm.Pending: {
		fsm.Start: fsm.Running, fsm.Cancel: fsm.Cancelled, fsm.Abort: fsm.Aborted,
		fsm.Orphan: fsm.Orphaned, fsm.Fail: fsm.Failed,
	},
	fsm.Running: {
		fsm.Checkpoint: fsm.Running, fsm.Wait: fsm.Waiting, fsm.Sleep: fsm.Sleeping,
		fsm.Retry: fsm.Sleeping, fsm.Hold: fsm.Completing, fsm.Complete: fsm.Completed,
		fsm.Fail: fsm.Failed, fsm.Cancel: fsm.Cancelled, fsm.Abort: fsm.Aborted,
		fsm.Recover: fsm.Pending,
	},
	fsm.Waiting:    {fsm.Wake: fsm.Pending, fsm.Cancel: fsm.Cancelled, fsm.Abort: fsm.Aborted},
	fsm.Sleeping:   {fsm.Wake: fsm.Pending, fsm.Cancel: fsm.Cancelled, fsm.Abort: fsm.Aborted},
	fsm.Completing: {fsm.Complete: fsm.Completed, fsm.Abort: fsm.Aborted},
}

func TestTransitionMatchesDesign(t *testing.T) {
	t.Parallel()
	for _, from := range fsm.Statuses {
		for _, event := range fsm.Events {
			want, allowed := design[from][event]
			got, err := fsm.Transition(from, event)
			if allowed {
				require.NoError(t, err, "%s --%s-->", from, event)
				require.Equal(t, want, got, "%s --%s-->", from, event)
				continue
			}
			require.Error(t, err, "%s --%s--> must be refused", from, event)
			require.ErrorIs(t, err, fsm.ErrInvalidTransition)
			var te *fsm.TransitionError
			require.True(t, errors.As(err, &te))
			require.Equal(t, from, te.From)
			require.Equal(t, event, te.Event)
		}
	}
	n := 0
	for _, row := range design {
		n += len(row)
	}
	require.Len(t, fsm.Edges(), n, "the table has edges the design does not")
}

func TestTransitionRejectsUnknown(t *testing.T) {
	t.Parallel()
	_, err := fsm.Transition("limbo", fsm.Start)
	require.ErrorIs(t, err, fsm.ErrInvalidTransition)
	_, err = fsm.Transition(fsm.Pending, "teleport")
	require.ErrorIs(t, err, fsm.ErrInvalidTransition)
}

func TestSettledHasNoEdges(t *testing.T) {
	t.Parallel()
	for _, e := range fsm.Edges() {
		require.False(t, e.From.Settled(), "settled status %s has an outgoing edge", e.From)
	}
	require.True(t, fsm.Orphaned.Settled())
	require.True(t, fsm.Completing.Live())
	require.False(t, fsm.Status("nope").Live())
}

// TestGeneratedFilesUpToDate fails when fsm.go changed and `go generate
// ./fsm` was not run: the docs diagram and the database guard must be the
// table's own.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		filepath.Join("..", "docs", "state-machine.md"):                         fsm.Mermaid(),
		filepath.Join("..", "migrations", "sql", "002_transition_guard.up.sql"): fsm.GuardSQL(),
	} {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, want, string(got), "%s is out of date: run go generate ./fsm", path)
	}
}
