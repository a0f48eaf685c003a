package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shortFreezeLease is the conversation lease of the short freeze: longer
// than the other scenarios', so that the window the freeze must fall in (a
// quarter of the lease, see below) is wide against the test's own latency
// in seeing a renewal and sending SIGSTOP.
const shortFreezeLease = 3 * time.Second

// TestBrieflyFrozenRunner (e): two runner processes; one is frozen with
// SIGSTOP soon after a renewal of its leases landed, until 7/8 of the lease
// counted from that renewal: past the point (3/4 of the lease after its
// last renewal) where it must stop its handlers, since it cannot confirm
// its leases, but before any lease of it can expire in the database, so
// that nobody may take over during the freeze. Resumed, it must stop its
// handlers at once — and they must return — before the other node can
// take its conversations (at 1/8 of the lease after the resume): no two
// calls of a task at once, with no exemption, and no side effect after
// another call of a task started.
//
// It rests on durations: what it tests needs the freeze to begin before
// the node's fence point (3/4 of the lease after the renewal; the node's
// own, counted from the renewal's send, is no later) and the thaw to come
// after it and before the leases' expiry in the database. The thaw is
// timed from the expiry read once the node is frozen, so only a machine
// too slow to send SIGSTOP within 5/8 of the lease of the poll that saw a
// fresh renewal (every lease then had more than 7/8 of it to run), or to
// wake a sleeping test within 1/8 of the lease, misses it. (Freezing later
// than right after the renewal only makes the freeze shorter, which tests
// the same.) The test checks afterwards that
// the freeze fell inside its window (its premises), and fails saying so
// if it did not.
func TestBrieflyFrozenRunner(t *testing.T) {
	s := setup(t, conversations)
	lease := shortFreezeLease
	frozen := s.startChild("e-frozen", lease)
	other := s.startChild("e-other", lease)
	s.WaitFor("well-behaved calls in flight in "+frozen.node, func() bool {
		return s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND kind IN ('tool', 'once', 'leaf') AND returned_at IS NULL`, frozen.node) >= 2
	})

	// Freeze when every lease of the node has more than 7/8 of the lease
	// to run (a renewal just landed: it holds for about 1/8 of the lease
	// after each) and well-behaved calls of it are in flight.
	var frozenAt time.Time
	for frozenAt.IsZero() {
		var fresh bool
		var calls int
		s.Retry("leases", func(ctx context.Context) error {
			return s.Pool.QueryRow(ctx, s.Q(`SELECT coalesce(min(lease_expires_at) > clock_timestamp() + $2::interval, false),
					(SELECT count(*) FROM {s}.run_log WHERE node = $1 AND kind IN ('tool', 'once') AND returned_at IS NULL)
				FROM {s}.conversation_leases WHERE holder = $1`), frozen.node, (7*lease/8).String()).Scan(&fresh, &calls)
		})
		switch {
		case fresh && calls > 0:
			frozenAt, _ = s.freeze(frozen)
		case s.Done():
			t.Fatal("the work was done before the freeze; the workload is too small")
		default:
			time.Sleep(2 * time.Millisecond) // a poll of the leases, not a wait for an effect
		}
	}
	// Statements the node sent before the freeze may still run: the
	// leases are read once none of its backends is active.
	s.WaitFor("no statement of "+frozen.node+" running", func() bool {
		return s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query NOT ILIKE 'LISTEN%'`,
			appPrefix+frozen.node) == 0
	})
	var expires time.Time
	var held int
	s.Retry("leases", func(ctx context.Context) error {
		return s.Pool.QueryRow(ctx, s.Q(`SELECT min(lease_expires_at), count(*) FROM {s}.conversation_leases WHERE holder = $1`),
			frozen.node).Scan(&expires, &held)
	})
	require.Positive(t, held, "the frozen node holds conversations")
	convs := s.Column(`SELECT id FROM {s}.conversations WHERE holder = $1`, frozen.node)
	tokens := s.inFlight(frozen.node, frozenAt)
	// Thaw at 7/8 of the lease after the renewal: the freeze's length is
	// the fault itself, so this is a timer, not a wait for a condition.
	time.Sleep(time.Until(expires.Add(-lease / 8)))
	thawedAt := s.thaw(frozen)
	s.Fault("freeze", frozen.node, "", frozenAt, thawedAt)
	s.WaitSettled()
	s.stopAll()
	s.Verify()

	frozenFor := thawedAt.Sub(frozenAt)
	takenDuring := s.Count(`SELECT count(*) FROM {s}.chaos_audit a JOIN {s}.tasks t ON t.id = a.task_id
		WHERE a.new_status = 'running' AND a.old_status IS DISTINCT FROM 'running' AND a.app = $1 AND a.at BETWEEN $2 AND $3
		  AND t.conversation_id = ANY($4)`, appPrefix+other.node, frozenAt, thawedAt, convs)
	// The child may resume and cancel before this process reads its clock
	// after sending SIGCONT: resume_to_cancel can be a little negative.
	cancelled := s.Rows(`SELECT count(*) AS calls,
			round(1000 * extract(epoch FROM max(cancelled_at - $3::timestamptz)))::text || ' ms' AS resume_to_cancel_max,
			round(1000 * extract(epoch FROM max(returned_at - cancelled_at)))::text || ' ms' AS cancel_to_return_max,
			round(1000 * extract(epoch FROM max(returned_at - $3::timestamptz)))::text || ' ms' AS resume_to_return_max
		FROM {s}.run_log WHERE node = $1 AND started_at < $2 AND cancelled_at > $2`, frozen.node, frozenAt, thawedAt)
	t.Logf("(e) frozen for %s (%.2f of the lease) with %d runs in flight and %d conversations held, %s after a renewal; thawed %s before the first lease could expire; calls cancelled after the resume: %v",
		frozenFor.Round(time.Millisecond), frozenFor.Seconds()/lease.Seconds(), len(tokens), held,
		frozenAt.Sub(expires.Add(-lease)).Round(time.Millisecond), expires.Sub(thawedAt).Round(time.Millisecond), cancelled)
	fencePoint := expires.Add(-lease / 4)
	require.True(t, frozenAt.Before(fencePoint) && thawedAt.After(fencePoint) && thawedAt.Before(expires),
		"premise: frozen at %s and thawed at %s, not across the fence point (%s, 3/4 of the lease after the node's last renewal) and before the leases' expiry (%s); the machine was too slow to freeze soon enough after a renewal",
		frozenAt.Format("15:04:05.000"), thawedAt.Format("15:04:05.000"), fencePoint.Format("15:04:05.000"), expires.Format("15:04:05.000"))
	require.Zero(t, takenDuring, "premise: nobody took over a conversation of the frozen node during the freeze")
}
