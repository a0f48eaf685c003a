package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestBlackholedNode (i): two runner processes, one of them ("cut")
// reaching the database through the fault proxy, the other directly. Once
// the cut one has well-behaved calls in flight, its route is blackholed
// (testdb.Proxy.Blackhole: nothing forwarded either way, nothing closed,
// new connections accepted and left unanswered) for three times the lease,
// and until the direct one has taken over every run it had in flight; then
// healed. Its process keeps running, and so does its run log, which goes to
// the database directly (the outside world is not cut off).
//
// A node that cannot reach the database cannot confirm its leases: it must
// stop its handlers — cancel their context — by 3/4 of the lease after its
// last confirmed renewal, and they must have returned before the other node
// could take over (the lease's end in the database, as it stood when the
// node was cut off). The proof: every well-behaved call in flight at the
// cut returned before that moment, with no side effect after the other
// node's call of its task started, and no two calls of a task at once.
// The latency from the cut to the cancel and from the cancel to the
// return is logged.
func TestBlackholedNode(t *testing.T) {
	s := setup(t, conversations)
	proxy, url := testdb.StartProxy(t)
	cut := s.startChildVia("i-cut", leaseDefault, url)
	direct := s.startChild("i-direct", leaseDefault)
	s.WaitFor("well-behaved calls in flight in "+cut.node, func() bool {
		return s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND kind IN ('tool', 'once') AND returned_at IS NULL`, cut.node) >= 2
	})
	proxy.Blackhole()
	cutAt := time.Now()
	// What the database holds of the node's leases once nothing it sent
	// before the cut still runs: the moment each of its conversations can
	// be taken over. A backend that waits for the rest of a message the
	// blackhole holds (ClientRead: the cut came between a statement's Bind
	// and its Execute) runs nothing until Heal, and stays so: the proxy
	// forwards the rest then, three leases later, when the node's renewal
	// matches no row (a renewal extends a live row only) and its other
	// writes are fenced by the epoch. A CI run waited two minutes on one.
	s.WaitFor("no statement of "+cut.node+" running", func() bool {
		return s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query NOT ILIKE 'LISTEN%'
			AND wait_event IS DISTINCT FROM 'ClientRead'`, appPrefix+cut.node) == 0
	})
	held := s.Count(`SELECT count(*) FROM {s}.conversations WHERE holder = $1`, cut.node)
	s.Exec(`CREATE TABLE {s}.chaos_cut_leases AS SELECT id AS conversation_id, lease_expires_at FROM {s}.conversation_leases WHERE holder = $1`, cut.node)
	tokens := s.inFlight(cut.node, cutAt)
	require.NotEmpty(t, tokens)
	// Such a backend, inside a transaction, keeps what that transaction
	// locked — a flush's conversations, which no other node can then take
	// over — and no timeout of the server's own ends it (it is neither idle
	// nor running a statement). On a real partition, TCP keepalives end it
	// (docs/operations.md, "A runner cut off from the database"); here the
	// proxy answers the server's probes, so the test plays that part: one
	// lease after the cut (the fault's own timing, not a wait for an
	// effect), it ends the backends of the cut node still waiting so, as a
	// server whose keepalives give up within a lease would.
	time.Sleep(time.Until(cutAt.Add(leaseDefault)))
	ended := s.Count(`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'active' AND wait_event = 'ClientRead' AND xact_start IS NOT NULL) x`, appPrefix+cut.node)
	t.Logf("(i) backends of %s ended one lease after the cut, as the server's keepalives would: %d", cut.node, ended)
	s.WaitFor("three leases, and the direct runner's take-over of every run the cut one had in flight", func() bool {
		return time.Since(cutAt) >= 3*leaseDefault &&
			s.Count(`SELECT count(*) FROM {s}.tasks WHERE status = 'running' AND token = ANY($1)`, tokens) == 0
	})
	proxy.Heal()
	healedAt := time.Now()
	s.Fault("cut", cut.node, "", cutAt, healedAt)
	s.WaitSettled()
	s.stopAll()
	s.Verify()

	// The calls in flight at the cut, against their conversation's lease
	// end (the take-over's earliest moment) and its 3/4 point.
	const inFlightSQL = `FROM {s}.run_log r JOIN {s}.chaos_cut_leases l USING (conversation_id)
		WHERE r.node = $1 AND r.started_at < $2 AND (r.returned_at IS NULL OR r.returned_at > $2)`
	late := s.Rows(`SELECT r.id AS call, r.task_id, r.kind, r.started_at, r.cancelled_at, r.cause, r.returned_at, l.lease_expires_at
		`+inFlightSQL+` AND NOT r.stubborn AND (r.returned_at IS NULL OR r.returned_at >= l.lease_expires_at) ORDER BY r.started_at LIMIT 20`, cut.node, cutAt)
	lat := s.Rows(`SELECT r.stubborn, count(*) AS calls, count(r.cancelled_at) AS cancelled,
			round(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY r.cancelled_at - $2::timestamptz)))::text || ' ms' AS cut_to_cancel_p50,
			round(1000 * extract(epoch FROM max(r.cancelled_at - $2::timestamptz)))::text || ' ms' AS cut_to_cancel_max,
			round(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY r.returned_at - r.cancelled_at)))::text || ' ms' AS cancel_to_return_p50,
			round(1000 * extract(epoch FROM max(r.returned_at - r.cancelled_at)))::text || ' ms' AS cancel_to_return_max,
			round(1000 * extract(epoch FROM max(r.returned_at - (l.lease_expires_at - $3::interval))))::text || ' ms' AS return_after_three_quarters_max,
			count(*) FILTER (WHERE r.returned_at IS NULL OR r.returned_at >= l.lease_expires_at) AS returned_after_lease_end
		`+inFlightSQL+` GROUP BY r.stubborn ORDER BY 1`, cut.node, cutAt, (leaseDefault / 4).String())
	after := s.Count(`SELECT count(*) FROM {s}.side_effects e JOIN {s}.run_log x ON x.id = e.call_id
		WHERE e.node = $1 AND NOT e.stubborn AND EXISTS (SELECT 1 FROM {s}.run_log y WHERE y.task_id = e.task_id AND y.node = $2
			AND y.started_at > x.started_at AND y.started_at < e.checked_at)`, cut.node, direct.node)
	t.Logf("(i) %s cut off for %s with %d runs in flight and %d conversations held; %d connections accepted unanswered meanwhile",
		cut.node, healedAt.Sub(cutAt).Round(time.Millisecond), len(tokens), held, proxy.Held())
	t.Logf("(i) calls in flight at the cut (by stubborn): %v", lat)
	t.Logf("(i) well-behaved side effects of the cut node after the take-over: %d", after)
	for _, row := range late {
		t.Logf("(i) returned after the other node could take over: %s", row)
	}
	require.Empty(t, late, "every well-behaved call in flight at the cut returned before the other node could take over")
	require.Zero(t, after, "no side effect of the cut node after the take-over")
}
