package machine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// A renewal that succeeds but comes back after the fence point fires the
// fence before it confirms the lease, even when the fence's own goroutine
// did not run meanwhile (starved): the take-over another node may have
// made in that window, reading the old row expired, must find this node's
// handlers stopped, and its conversations are re-validated by epoch
// before anything runs again.
func TestRenewalPastTheFencePointFiresTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Shared(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	l := newNodeLease(eng.C, "fence-after-late-renewal", 20*time.Second, slog.New(slog.DiscardHandler))
	var fired, confirmed int
	l.onFire = func() { fired++ }
	l.onConfirm = func(newLife bool) {
		require.False(t, newLife)
		confirmed++
	}
	require.NoError(t, l.begin(ctx))
	require.True(t, l.usable(time.Now()))

	// In time: nothing fires.
	require.True(t, l.renewOnce(ctx))
	require.Zero(t, fired)

	// The fence point passed with no fence goroutine running (none is
	// started here), and the row, renewed a moment ago for 20 s, is live:
	// the renewal succeeds, late.
	l.confirmed.Store(l.since(time.Now()))
	require.True(t, l.renewOnce(ctx))
	require.Equal(t, 1, fired, "the fence fired before the late renewal confirmed the lease")
	require.Equal(t, 1, confirmed, "then the renewal confirmed it again, for the conversations to be re-validated")
	require.True(t, l.usable(time.Now()))
}
