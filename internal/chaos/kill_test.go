package chaos

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// conversations is the workload's size in every scenario: 120 turns of
// eleven tasks.
const conversations = 120

// TestKilledRunners (a): one runner process at a time, killed with SIGKILL
// at random moments (after a random number of handler calls, 15 to 104,
// since it started) twelve times, a new one started after each kill; the
// last one finishes the work. Each new runner takes the conversations over
// once the dead one's leases (1 s) expire, recovering their running tasks
// (attempt + 1; abandon_on_restart ones settled cancelled). Every restart
// must be of a run a kill cut, at the engine's default restart limit.
func TestKilledRunners(t *testing.T) {
	s := setup(t, conversations)
	const kills = 12
	var inFlight []int
	for i := range kills {
		c := s.startChild(fmt.Sprintf("a%02d", i), leaseDefault)
		s.WaitProgress(s.Runs(), 15+s.rng.IntN(90))
		require.False(t, s.Done(), "kill %d: the work was done before it; the workload is too small for %d kills", i+1, kills)
		inFlight = append(inFlight, s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND returned_at IS NULL`, c.node))
		s.kill(c)
	}
	last := s.startChild("a-last", leaseDefault)
	s.WaitSettled()
	s.stop(last)
	f := s.Verify()
	t.Logf("(a) %d kills; handler calls in flight at each: %v", kills, inFlight)
	require.Positive(t, f.Cut, "some kills cut handlers mid-run")
	require.Positive(t, f.Restarts, "some tasks were recovered")
}
