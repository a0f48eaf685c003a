package machine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/core"
)

// rechecks counts the runs a sink was asked to look at again.
type rechecks struct{ n int }

func (s *rechecks) apply(context.Context, *Run, core.Outcome) core.OutcomeResult {
	return core.OutcomeResult{}
}
func (s *rechecks) ending(*Run)  {}
func (s *rechecks) recheck(*Run) { s.n++ }

// A write that may end the run (a reservation) has the runner look at the
// run again when it is over only if the watchdog left the run alone
// meanwhile for it: on the common path, with no check in between, the
// reservation is its one statement; a check that came while it was in
// flight is not lost; with two in flight, the last one over looks again;
// a run the write ended is not looked at.
func TestMayEndRechecksOnlyWhatTheWatchdogMissed(t *testing.T) {
	t.Parallel()
	s := &rechecks{}
	run := &Run{sink: s}

	run.mayEnd()()
	require.Zero(t, s.n, "no check came meanwhile: nothing to read again")

	decided := run.mayEnd()
	require.True(t, run.endingOrEnded(), "left alone while the write is in flight")
	decided()
	require.Equal(t, 1, s.n, "the check it missed is made again")
	require.False(t, run.endingOrEnded())
	run.mayEnd()()
	require.Equal(t, 1, s.n, "once")

	first, second := run.mayEnd(), run.mayEnd()
	require.True(t, run.endingOrEnded())
	first()
	require.Equal(t, 1, s.n, "the other write is still in flight: the watchdog would leave the run alone again")
	second()
	require.Equal(t, 2, s.n)

	decided = run.mayEnd()
	require.True(t, run.endingOrEnded())
	run.mu.Lock()
	run.ended = true // the write ended it (a budget's fail or park)
	run.mu.Unlock()
	decided()
	require.Equal(t, 2, s.n, "an ended run is not looked at")
}
