package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/machine"
)

// terminateFor is how long (b) terminates backends, and liveTurns the turns
// it keeps live meanwhile, creating more as they complete, so that there is
// work in flight at every round.
const (
	terminateFor = 2 * time.Minute
	liveTurns    = 40
)

// TestTerminatedBackends (b): two runner processes; every 1 to 3 s for two
// minutes, every backend of theirs — pool connections in and out of
// transactions, the runner's and the waker's LISTEN connections, River's —
// is terminated with pg_terminate_backend, found by the application_name
// their pools set (not their run logs': the outside world is not cut).
// Every transaction cut that way had not committed and is run again by
// the engine; a COMMIT cut in flight is resolved by the run. A backend
// termination is a transient fault that no process dies of: nothing may
// fail, nothing may be restarted (every task's attempt stays 0: no
// recovery, no abandoned once), and every turn completes with its result.
//
// The rounds come every 1 to 3 s by the clock (the fault's schedule); each
// waits first, on a condition, for both runners' arbor LISTEN connection to
// LISTEN again. Not for River's notifier's: River counts its listener's
// failures and never resets the count, backing off 0.5 s doubling to 64 s
// (river v0.51 internal/notifier), so from the eighth round on it is down
// for a minute or more after each cut — a CI run waited two minutes for it.
// The wake path does not need it: River's producer polls its queue every
// FetchPollInterval whether or not the notifier listens, and the waker's
// timers hear the sleep channel on arbor's connection. A round cuts River's
// LISTEN whenever it is up; the count of those is reported.
//
// The runners hold the default lease (ConversationLeaseDefault), not the
// suite's 2 s: no runner dies here, so no take-over waits on it, and the
// guarantee holds only for a lease longer than a reconnect takes. A round
// cuts every connection of both runners at once, and on this 2-core machine
// (two race-built runners, the test and the server on it) a new connection
// then took up to 1.7 s to open — an outside probe's too (p50 14 ms, p99
// 0.43 s, max 1.3 s) — against the 1.5 s after the last renewal at which a
// 2 s lease's fence fires: the fence fired by the clock, as it must, and a
// once task whose handler it stopped was abandoned. The runner warns of a
// renewal that waited that long (TestSlowReconnectIsReported), and
// docs/operations.md says how to size the lease.
func TestTerminatedBackends(t *testing.T) {
	s := setup(t, conversations)
	nodes := []*child{s.startChild("b1", machine.ConversationLeaseDefault), s.startChild("b2", machine.ConversationLeaseDefault)}
	r := s.terminationRounds(nodes, appPrefix+"b%", terminateFor, liveTurns, nil)
	s.WaitSettled()
	s.stopAll()
	s.Verify()
	t.Logf("(b) %s", r)
}

// rounds tallies termination rounds.
type rounds struct {
	n, killed, listening, riverListening, inTx, created int
	d                                                   time.Duration
}

func (r rounds) String() string {
	return fmt.Sprintf("%d rounds in %s: %d backends terminated, %d of them LISTENing (%d of those River's notifier's), %d in a transaction or a statement; %d turns created during the rounds",
		r.n, r.d, r.killed, r.listening, r.riverListening, r.inTx, r.created)
}

// terminationRounds terminates, every 1 to 3 s for d, every backend whose
// application_name is LIKE app (the nodes'), keeping live turns live
// by creating more (with fan's leaves: see addTurns) as they complete. Each
// round first waits for every node's arbor connection to LISTEN again
// (see TestTerminatedBackends).
func (s *scenario) terminationRounds(nodes []*child, app string, d time.Duration, live int, fan func(i int) int) rounds {
	t := s.T
	t.Helper()
	r := rounds{d: d}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		// Each round cuts the LISTEN connections too: wait until both
		// runners are listening again after the last round.
		for _, c := range nodes {
			s.WaitFor(c.node+"'s arbor connection to LISTEN again", func() bool {
				return s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'
					AND query NOT ILIKE '%river%'`, appPrefix+c.node) >= 1
			})
		}
		time.Sleep(time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second))))
		if n := s.Count(`SELECT count(*) FROM {s}.tasks WHERE kind = $1 AND status IN ('pending','running','waiting','sleeping','completing')`,
			faultharness.TurnKind); n < live {
			s.AddTurns(live-n, fan)
			r.created += live - n
		}
		n, l, rl, x := s.terminate(app)
		require.Positive(t, l-rl, "round %d terminated arbor LISTEN connections", r.n+1)
		r.n, r.killed, r.listening, r.riverListening, r.inTx = r.n+1, r.killed+n, r.listening+l, r.riverListening+rl, r.inTx+x
	}
	return r
}

// terminate terminates every backend whose application_name is LIKE app,
// and returns how many, how many were LISTENing, how many of those were
// River's notifier's, and how many were in a transaction or running a
// statement.
func (s *scenario) terminate(app string) (n, listening, river, busy int) {
	s.T.Helper()
	s.Retry("terminate", func(ctx context.Context) error {
		return s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%' AND state = 'idle'),
				count(*) FILTER (WHERE query ILIKE 'LISTEN%' AND query ILIKE '%river%' AND state = 'idle'),
				count(*) FILTER (WHERE state <> 'idle')
			FROM (SELECT query, state, pg_terminate_backend(pid) AS done FROM pg_stat_activity
				WHERE application_name LIKE $1 AND pid <> pg_backend_pid()) x WHERE done`, app).Scan(&n, &listening, &river, &busy)
	})
	return n, listening, river, busy
}
