package machine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

func TestGenerations(t *testing.T) {
	t.Parallel()
	now := time.Now()
	root := func(id int64, kind string, st arbortype.Status, started bool) arbortype.Task {
		r := arbortype.Task{ID: id, Kind: kind, Status: st}
		if started {
			r.StartedAt = &now
		}
		return r
	}
	// None under way: the oldest pending generation, and non-generations.
	roots := []arbortype.Task{root(1, "turn", arbortype.StatusPending, false), root(2, "turn", arbortype.StatusPending, false), root(3, "cron", arbortype.StatusPending, false)}
	isTurn := func(k string) bool { return k == "turn" }
	require.Equal(t, []int64{1, 3}, generations(roots, isTurn))
	require.Equal(t, []int64{1}, generations(roots[:2], nil))
	// One waiting: nothing else starts; it is the next waiting generation.
	roots = []arbortype.Task{root(1, "turn", arbortype.StatusWaiting, true), root(2, "turn", arbortype.StatusPending, false)}
	require.Empty(t, generations(roots, nil))
	require.NotNil(t, generations(roots, nil), "none startable is an empty list, not \"any root\"")
	// The one under way was woken (pending, started): it resumes, not the next.
	roots = []arbortype.Task{root(1, "turn", arbortype.StatusPending, true), root(2, "turn", arbortype.StatusPending, false)}
	require.Equal(t, []int64{1}, generations(roots, nil))
}
