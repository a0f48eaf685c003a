package chaos

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKilledRunnersUnderLoad (f): the kill loop of (a) beside a CPU hog
// that busy-loops on four times the machine's cores, for the whole
// scenario, and beside a steady runner that is never killed. Every kill
// puts the dead runner's conversations up for the steady one (or the next
// runner) to take over, while every process — the runners, the database,
// the test — gets a fraction of the CPU it wants. Under that pressure a
// runner may be late to renew its leases; what it must not do is run a
// task twice at once (a conversation given up, opened again and the task
// claimed again while the cancelled call still runs), nor restart a run
// that no kill cut.
func TestKilledRunnersUnderLoad(t *testing.T) {
	s := setup(t, 100)
	threads := 4 * runtime.NumCPU()
	s.startHog(threads)
	steady := s.startChild("f-steady", leaseDefault)
	const kills = 6
	for i := range kills {
		c := s.startChild(fmt.Sprintf("f%02d", i), leaseDefault)
		s.WaitProgress(s.Runs(), 15+s.rng.IntN(90))
		require.False(t, s.Done(), "kill %d: the work was done before it; the workload is too small for %d kills", i+1, kills)
		s.kill(c)
	}
	s.WaitSettled()
	s.stop(steady)
	f := s.Verify()
	t.Logf("(f) %d kills beside a CPU hog of %d busy threads on %d cores and a steady runner", kills, threads, runtime.NumCPU())
	require.Positive(t, f.Restarts, "some tasks were recovered")
}
