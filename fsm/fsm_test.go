package fsm_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
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
	arbortype.StatusWaiting: {fsm.Wake: arbortype.StatusPending, fsm.Cancel: arbortype.StatusCancelled, fsm.Abort: arbortype.StatusAborted, fsm.Expire: arbortype.StatusFailed,
		fsm.Rerun: arbortype.StatusWaiting},
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
			require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
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
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
	_, err = fsm.Transition(arbortype.StatusPending, "teleport")
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
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
