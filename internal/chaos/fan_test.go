package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/faultharness"
)

// TestKilledDuringFlushes (h): the workload with big fan-outs — one turn in
// three spawns 50 to 200 leaves beside its tree, all in one SpawnMany, so
// that its flush inserts that many rows, and the leaves' completions come
// in large batches — and one runner process at a time, killed with SIGKILL
// at high frequency: as soon as it has a transaction open on the spawn
// insert (polled every 2 ms in pg_stat_activity), or after 10 to 49
// handler calls if none comes first. A flush cut before its COMMIT is
// rolled back whole, and redone by the next holder's run of the turn (the
// spawns' keys return what a committed one made).
func TestKilledDuringFlushes(t *testing.T) {
	s := setup(t, 0)
	s.AddTurns(102, func(i int) int {
		if i%3 != 0 {
			return 0
		}
		return 50 + (i*37)%151
	})
	const kills = 16
	var inFlush int
	for i := range kills {
		c := s.startChild(fmt.Sprintf("h%02d", i), leaseDefault)
		from, n := s.Runs(), 10+s.rng.IntN(40)
		deadline := time.Now().Add(faultharness.WaitWithin)
		for {
			if s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL
					AND state <> 'idle' AND query ILIKE '%INSERT INTO %.tasks AS t%SELECT v.conv, nullif(v.owner, 0)%'`, appPrefix+c.node) > 0 {
				inFlush++
				break
			}
			if s.Runs() >= from+n || s.Done() {
				break
			}
			require.True(t, time.Now().Before(deadline), "kill %d: no progress of %s", i+1, c.node)
			time.Sleep(2 * time.Millisecond) // a poll of pg_stat_activity
		}
		require.False(t, s.Done(), "kill %d: the work was done before it; the workload is too small for %d kills", i+1, kills)
		s.kill(c)
	}
	last := s.startChild("h-last", leaseDefault)
	s.WaitSettled()
	s.stop(last)
	f := s.Verify()
	t.Logf("(h) %d kills, %d of them with a spawn insert of the node in flight", kills, inFlush)
	// The poll's pattern must match the spawn insert (a CTE since the log
	// is written by the statements), within the statement's first 1,024
	// bytes (pg_stat_activity's track_activity_query_size): it once matched
	// none, and every kill came after n runs instead, unnoticed.
	require.Positive(t, inFlush, "some kills came with a spawn insert in flight")
	require.Positive(t, f.Restarts, "some tasks were recovered")
}
