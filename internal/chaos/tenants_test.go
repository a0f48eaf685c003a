package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/faultharness"
)

// TestTenantsLimitsUnderKills (t): 60 conversations of the workload over
// three tenants (a conversation in three each), whose tool calls (tool0,
// tool1 and the stubborn tool2 of every turn) name the concurrency key
// "search", under two limits: "key:search" at most 3 running across every node, and
// "tenant:t1" at most 4 (every task of t1's conversations: turns, tools,
// groups, naps…); t3 weighs 2 in the fair claim. A steady runner process
// and two others that are killed with SIGKILL in turn, at random moments
// (after 25 to 99 handler calls), six times, a new one started after each
// kill. A killed runner's runs keep their slots until the take-over's
// recovery gives them back (design.md §3.15), so the kills hold work of
// both keys back for a lease. While it runs, the limits are read every
// 25 ms (faultharness.Scenario.SampleLimits: running ≤ max, and each count
// equal to the running tasks naming it); after it, the usual proof
// (Verify) and the limits' (VerifyLimits): at no moment more calls of a
// key in flight than its max, from the run log's intervals; no more runs
// holding its slots, from the audit; and no slot leaked.
func TestTenantsLimitsUnderKills(t *testing.T) {
	const searchMax, t1Max = 3, 4
	s := setupWith(t, 60, faultharness.Config{Tenants: []string{"t1", "t2", "t3"}, ToolKey: "search"}, func(s *scenario) {
		require.NoError(t, s.Engine.SetConcurrencyLimit(s.Ctx, "key:search", searchMax))
		require.NoError(t, s.Engine.SetConcurrencyLimit(s.Ctx, "tenant:t1", t1Max))
		require.NoError(t, s.Engine.SetTenantWeight(s.Ctx, "t3", 2))
	})
	sampler := s.SampleLimits(25 * time.Millisecond)
	steady := s.startChild("t-steady", leaseDefault)
	live := []*child{s.startChild("t00", leaseDefault), s.startChild("t01", leaseDefault)}
	const kills = 6
	var inFlight []int
	for i := range kills {
		s.WaitProgress(s.Runs(), 25+s.rng.IntN(75))
		require.False(t, s.Done(), "kill %d: the work was done before it; the workload is too small for %d kills", i+1, kills)
		c := live[i%2]
		inFlight = append(inFlight, s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND returned_at IS NULL`, c.node))
		s.kill(c)
		live[i%2] = s.startChild(fmt.Sprintf("t%02d", i+2), leaseDefault)
	}
	s.WaitSettled()
	sampled, violations := sampler.Stop()
	s.stop(steady)
	for _, c := range live {
		s.stop(c)
	}
	f := s.Verify()
	limits := s.VerifyLimits(sampled, violations)
	t.Logf("(t) %d kills; handler calls in flight at each: %v", kills, inFlight)
	require.Positive(t, f.Restarts, "some tasks were recovered")
	for key, max := range map[string]int{"key:search": searchMax, "tenant:t1": t1Max} {
		l := limits[key]
		require.Equal(t, max, l.Max, key)
		require.Positive(t, l.Sampled.AtMax, "%s: the limit was full in some reads (it held work back)", key)
	}
}
