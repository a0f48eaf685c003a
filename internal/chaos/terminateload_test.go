package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/machine"
)

// Sizes of (j): its turns, each with jLeaves abandon_on_restart leaves
// beside its tree (and its once), jLive of them kept live during the
// rounds, and the CPU hog's busy loops.
const (
	jTurns     = 60
	jLeaves    = 20
	jLive      = 30
	jTerminate = 2 * time.Minute
	jHog       = 4
)

// TestTerminatedBackendsUnderLoad (j): the termination rounds of (b) —
// every backend of the runner processes terminated every 1 to 3 s for two
// minutes — beside a CPU hog of four busy loops for the whole scenario,
// with hundreds of abandon_on_restart tasks in the workload: every turn
// spawns, beside its tree and its once, twenty abandon_on_restart leaves
// in one SpawnMany, whose completions come in large batches. On a starved
// machine a flush's transaction is cut again and again; whatever its
// retries meet, an abandon_on_restart handler is never entered twice (the
// run log's entries: reentries), and, as in (b), nothing fails, nothing
// is restarted, nothing is abandoned and every turn completes with its
// result. Issue 38 measured 40 and 20 tasks entered twice at 3f96658,
// after the flush of their ending gave up with ErrUnavailable; with two
// runners and ten leaves a turn, this scenario found 32 in one run of two
// there, and 70 with three runners and twenty leaves: three runners make
// more flushes in flight at each round, on a CPU they share with the hog.
func TestTerminatedBackendsUnderLoad(t *testing.T) {
	s := setup(t, 0)
	s.OnceLeaves = true
	fan := func(int) int { return jLeaves }
	s.AddTurns(jTurns, fan)
	s.startHog(jHog)
	var nodes []*child
	for _, node := range []string{"j1", "j2", "j3"} {
		nodes = append(nodes, s.startChild(node, machine.ConversationLeaseDefault))
	}
	r := s.terminationRounds(nodes, appPrefix+"j%", jTerminate, jLive, fan)
	s.WaitSettled()
	s.stopAll()
	f := s.Verify()
	t.Logf("(j) %s; beside a CPU hog of %d busy loops", r, jHog)
	require.GreaterOrEqual(t, f.AORTasks, jTurns*(jLeaves+1), "hundreds of abandon_on_restart tasks")
}
