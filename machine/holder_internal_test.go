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

// leaseCalls counts the fence's firings and the confirmations after one
// of a test's node lease.
type leaseCalls struct{ fired, confirmed int }

// beganLease is a node lease of a test's own (its life begun, on the
// package's shared schema, no goroutine of it running), with a 20 s lease,
// whose firings and confirmations are counted; a new life fails the test.
func beganLease(t *testing.T, name string) (*nodeLease, *leaseCalls) {
	t.Helper()
	pool, schema := testdb.Shared(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	l := newNodeLease(eng.C, name, 20*time.Second, slog.New(slog.DiscardHandler))
	calls := &leaseCalls{}
	l.onFire = func() { calls.fired++ }
	l.onConfirm = func(newLife bool) {
		require.False(t, newLife)
		calls.confirmed++
	}
	require.NoError(t, l.begin(context.Background()))
	return l, calls
}

// A renewal that succeeds but comes back after the fence point fires the
// fence before it confirms the lease, even when the fence's own goroutine
// did not run meanwhile (starved): the take-over another node may have
// made in that window, reading the old row expired, must find this node's
// handlers stopped, and its conversations are re-validated by epoch
// before anything runs again.
func TestRenewalPastTheFencePointFiresTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, calls := beganLease(t, "fence-after-late-renewal")
	require.True(t, l.usable(time.Now()))

	// In time: nothing fires.
	require.True(t, l.renewOnce(ctx))
	require.Zero(t, calls.fired)

	// The fence point passed with no fence goroutine running (none is
	// started here), and the row, renewed a moment ago for 20 s, is live:
	// the renewal succeeds, late.
	l.confirmed.Store(l.since(time.Now()))
	require.True(t, l.renewOnce(ctx))
	require.Equal(t, 1, calls.fired, "the fence fired before the late renewal confirmed the lease")
	require.Equal(t, 1, calls.confirmed, "then the renewal confirmed it again, for the conversations to be re-validated")
	require.True(t, l.usable(time.Now()))
}

// A renewal answered long after it was sent (the process frozen or
// starved between its send and the read of its answer) vouches for the
// lease only until its send time plus the lease: past the fence point, it
// is no confirmation. The fence fires and stays fired, the renewal reports
// failure (so the loop renews again at once rather than a sixth of the
// lease later, by when the row may have expired), and the next renewal,
// sent now, confirms the lease.
func TestRenewalAnsweredTooLateDoesNotConfirm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, calls := beganLease(t, "late-answer")
	ttl := l.ttl

	// Sent 7/8 of the lease ago, answered now: live in the database, but
	// past the fence point (3/4 of the lease after its send).
	sent := time.Now().Add(-7 * ttl / 8)
	l.confirmed.Store(l.since(sent) + int64(ttl)) // the renewal before it: as old
	require.False(t, l.answered(sent), "an answer too late to vouch for the lease is not a confirmation")
	require.Equal(t, 1, calls.fired, "the fence fired")
	require.Zero(t, calls.confirmed, "the fence's firing did not end")
	require.False(t, l.usable(time.Now()))

	require.True(t, l.renewOnce(ctx), "a renewal sent now confirms the lease")
	require.Equal(t, 1, calls.fired)
	require.Equal(t, 1, calls.confirmed, "and ends the fence's firing")
	require.True(t, l.usable(time.Now()))
}

// The next renewal is timed from the send of the last one that confirmed
// the lease: after an answer that came late but in time (here 0.7 of the
// lease after its send, before the fence point at 0.75), it goes at once,
// not a sixth of the lease after the answer (past the fence point, which
// would fire the fence under a live row).
func TestRenewalAfterALateAnswerGoesAtOnce(t *testing.T) {
	t.Parallel()
	l, calls := beganLease(t, "late-in-time")
	ttl := l.ttl
	now := time.Now()
	require.InDelta(t, float64(ttl/6), float64(l.untilNextRenewal(now)), float64(ttl/100), "after an answer at once: a sixth of the lease")

	sent := now.Add(-7 * ttl / 10)
	l.confirmed.Store(l.since(sent) + int64(ttl))
	require.True(t, l.answered(sent), "in time: a confirmation")
	require.Zero(t, l.untilNextRenewal(now), "the next renewal goes at once")
	require.Zero(t, calls.fired, "the fence did not fire")
}
