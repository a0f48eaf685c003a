package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/faultharness"
)

// TestLockedConversation (g): one runner process; once it holds
// conversations with calls in flight, the test locks the row of one of
// them — one with a well-behaved call in flight — with SELECT … FOR UPDATE
// in a transaction of its own, and holds the lock for three times the
// conversation lease while the other conversations run on the same node.
// One row that an outside connection holds (a long report, an operator's
// psql) must cost that conversation at most, never the node's others:
// none of their tasks is run again (no recovery, no second call of a run),
// and the locked conversation completes once the lock is released.
//
// The lock lasts by the clock (three leases: the fault's length) and until
// the others made progress meanwhile; whether a statement of the runner
// waited on it is reported, not required (a runner that never waits on a
// row lock is what the scenario hopes for).
func TestLockedConversation(t *testing.T) {
	s := setup(t, conversations)
	node := s.startChild("g1", leaseDefault)
	var conv string
	s.WaitFor("a held conversation with a well-behaved call in flight", func() bool {
		found := s.Column(`SELECT r.conversation_id FROM {s}.run_log r JOIN {s}.conversations c ON c.id = r.conversation_id
			WHERE r.node = $1 AND r.kind IN ('tool', 'once') AND r.returned_at IS NULL AND c.holder = $1 LIMIT 1`, node.node)
		if len(found) > 0 {
			conv = found[0]
		}
		return conv != ""
	})
	lockCtx, cancel := context.WithTimeout(s.Ctx, faultharness.WaitWithin)
	defer cancel()
	tx, err := s.Pool.Begin(lockCtx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(s.Ctx) }()
	var lockPid int
	require.NoError(t, tx.QueryRow(lockCtx, `SELECT pg_backend_pid()`).Scan(&lockPid))
	_, err = tx.Exec(lockCtx, s.Q(`SELECT 1 FROM {s}.conversations WHERE id = $1 FOR UPDATE`), conv)
	require.NoError(t, err)
	lockedAt := time.Now()
	from := s.Runs()
	var blocked []string
	s.WaitFor("three leases and progress of the other conversations under the lock", func() bool {
		if len(blocked) == 0 {
			blocked = s.Rows(`SELECT pid, left(query, 100) AS query, (now() - query_start)::text AS waited
				FROM pg_stat_activity WHERE application_name = $1 AND $2 = ANY(pg_blocking_pids(pid))`, appPrefix+node.node, lockPid)
		}
		return time.Since(lockedAt) >= 3*leaseDefault && (s.Runs() >= from+30 || s.Done())
	})
	require.NoError(t, tx.Rollback(s.Ctx))
	releasedAt := time.Now()
	s.Fault("lock", "", conv, lockedAt, releasedAt)
	during := s.Count(`SELECT count(*) FROM {s}.run_log WHERE conversation_id <> $1 AND started_at BETWEEN $2 AND $3`, conv, lockedAt, releasedAt)
	s.WaitSettled()
	s.stop(node)
	s.Verify()

	rerun := s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id <> $1 AND attempt > 0`, conv)
	again := s.Count(`SELECT count(*) FROM (SELECT token FROM {s}.run_log WHERE conversation_id <> $1 GROUP BY token HAVING count(*) > 1) x`, conv)
	lockedAttempts := s.Count(`SELECT coalesce(sum(attempt), 0) FROM {s}.tasks WHERE conversation_id = $1`, conv)
	t.Logf("(g) %s locked for %s; %d calls of the other conversations started under the lock; runner statements seen waiting on it: %v",
		conv, releasedAt.Sub(lockedAt).Round(time.Millisecond), during, blocked)
	t.Logf("(g) the other conversations: %d tasks recovered, %d runs called again; the locked one: %d restarts", rerun, again, lockedAttempts)
	require.Positive(t, during, "the other conversations ran while the row was locked")
	require.Zero(t, rerun, "no task of another conversation was recovered")
	require.Zero(t, again, "no run of another conversation was called twice")
}
