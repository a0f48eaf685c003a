package fsm_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/guardhistory"
)

// design is docs/design.md §2 written out by hand, row by row, so that a change to
// the table in fsm.go that the contract does not have fails here.
var design = map[arbortype.Status]map[fsm.Event]arbortype.Status{
	arbortype.StatusPending: {
		fsm.Start: arbortype.StatusRunning, fsm.Cancel: arbortype.StatusCancelled, fsm.Abort: arbortype.StatusAborted,
		fsm.Orphan: arbortype.StatusOrphaned, fsm.Fail: arbortype.StatusFailed, fsm.Expire: arbortype.StatusFailed,
	},
	arbortype.StatusRunning: {
		fsm.Checkpoint: arbortype.StatusRunning, fsm.Wait: arbortype.StatusWaiting, fsm.Sleep: arbortype.StatusSleeping,
		fsm.Retry: arbortype.StatusSleeping, fsm.Await: arbortype.StatusSleeping, fsm.Hold: arbortype.StatusCompleting, fsm.Complete: arbortype.StatusCompleted,
		fsm.Fail: arbortype.StatusFailed, fsm.Expire: arbortype.StatusFailed, fsm.Cancel: arbortype.StatusCancelled, fsm.Abort: arbortype.StatusAborted,
		fsm.Recover: arbortype.StatusPending,
	},
	arbortype.StatusWaiting:    {fsm.Wake: arbortype.StatusPending, fsm.Cancel: arbortype.StatusCancelled, fsm.Abort: arbortype.StatusAborted, fsm.Expire: arbortype.StatusFailed},
	arbortype.StatusSleeping:   {fsm.Wake: arbortype.StatusPending, fsm.Cancel: arbortype.StatusCancelled, fsm.Abort: arbortype.StatusAborted, fsm.Expire: arbortype.StatusFailed},
	arbortype.StatusCompleting: {fsm.Complete: arbortype.StatusCompleted, fsm.Abort: arbortype.StatusAborted, fsm.Expire: arbortype.StatusFailed},
}

func TestTransitionMatchesDesign(t *testing.T) {
	t.Parallel()
	for _, from := range arbortype.Statuses {
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
	_, err = fsm.Transition(arbortype.StatusPending, "teleport")
	require.ErrorIs(t, err, fsm.ErrInvalidTransition)
}

func TestSettledHasNoEdges(t *testing.T) {
	t.Parallel()
	for _, e := range fsm.Edges() {
		require.False(t, e.From.Settled(), "settled status %s has an outgoing edge", e.From)
	}
	require.True(t, arbortype.StatusOrphaned.Settled())
	require.True(t, arbortype.StatusCompleting.Live())
	require.False(t, arbortype.Status("nope").Live())
}

// TestGeneratedFilesUpToDate fails when fsm.go changed and `go generate
// ./fsm` was not run: the docs diagram, the database guard and its history
// must be the table's own.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	guards := filepath.Join("..", "migrations", "guard")
	version, err := strconv.Atoi(fsm.GuardMigration[:3])
	require.NoError(t, err)
	want, err := guardhistory.Regenerate(guards, version, fsm.GuardSQL())
	require.NoError(t, err)
	held, err := filepath.Glob(filepath.Join(guards, "*"))
	require.NoError(t, err)
	for _, path := range held {
		_, ok := want[path]
		require.True(t, ok, "%s is stale: run go generate ./fsm", path)
	}
	want[filepath.Join("..", "docs", "state-machine.md")] = fsm.Mermaid()
	want[filepath.Join("..", "migrations", "sql", fsm.GuardMigration+".up.sql")] = fsm.GuardUpSQL()
	want[filepath.Join("..", "migrations", "sql", fsm.GuardMigration+".down.sql")] = fsm.GuardDownSQL()
	for path, content := range want {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, content, string(got), "%s is out of date: run go generate ./fsm", path)
	}
}
