package chaos

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTerminatedBackends (b): two runner processes; six times, at random
// moments (after 60 to 179 more handler calls), every backend of theirs —
// pool connections in and out of transactions, the runner's and the
// waker's LISTEN connections, River's — is terminated with
// pg_terminate_backend, found by the application_name their pools set.
// Every transaction cut that way had not committed and is run again by the
// engine; a COMMIT cut in flight is resolved by the run. Nothing may fail,
// and every turn completes with its result.
func TestTerminatedBackends(t *testing.T) {
	s := setup(t, conversations)
	nodes := []*child{s.startChild("b1", leaseDefault), s.startChild("b2", leaseDefault)}
	const rounds = 6
	from := s.runs()
	var killed, listening, inTx int
	for i := range rounds {
		from = s.waitProgress(from, 60+s.rng.IntN(120))
		require.False(t, s.done(), "round %d: the work was done before it; the workload is too small for %d rounds", i+1, rounds)
		// Each round cuts the LISTEN connections too: wait until both
		// runners are listening again after the last round.
		for _, c := range nodes {
			s.waitFor(c.node+" to LISTEN again", func() bool {
				return s.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, appPrefix+c.node) >= 2
			})
		}
		n, l, x := s.terminate(appPrefix + "b%")
		require.Positive(t, l, "round %d terminated LISTEN connections", i+1)
		killed, listening, inTx = killed+n, listening+l, inTx+x
	}
	s.waitSettled()
	s.stopAll()
	s.verify()
	t.Logf("(b) %d rounds: %d backends terminated, %d of them LISTENing, %d in a transaction or a statement", rounds, killed, listening, inTx)
}

// terminate terminates every backend whose application_name is LIKE app,
// and returns how many, how many were LISTENing, and how many were in a
// transaction or running a statement.
func (s *scenario) terminate(app string) (n, listening, busy int) {
	s.t.Helper()
	s.retry("terminate", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%' AND state = 'idle'),
				count(*) FILTER (WHERE state <> 'idle')
			FROM (SELECT query, state, pg_terminate_backend(pid) AS done FROM pg_stat_activity
				WHERE application_name LIKE $1 AND pid <> pg_backend_pid()) x WHERE done`, app).Scan(&n, &listening, &busy)
	})
	s.t.Logf("terminated %d backends of %s (%d LISTENing, %d busy)", n, app, listening, busy)
	return n, listening, busy
}
