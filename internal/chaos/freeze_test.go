package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestFrozenRunner (d): two runner processes; one is frozen with SIGSTOP
// while it has calls in flight — of the stubborn kind and well-behaved
// ones — until the other has taken over every run it had in flight (its
// leases, 1 s, expired; the take-over recovered the runs, killing their
// tokens), then resumed with SIGCONT.
//
// A process frozen past its lease is the one case where two calls of a
// task run at once and no runner can prevent it: the frozen calls resume
// after another node took over. The proof exempts them from the overlap
// rule and holds them instead to this: no side effect decided after the
// take-over (a well-behaved call checks its context before each side
// effect, so the runner must have cancelled it by the time it runs again),
// every one of them returns (how long after the resume is logged), and the
// stubborn calls — which heartbeat, checkpoint and complete whatever they
// are told — have every write refused: nothing stamped by a run that was
// in flight at the freeze lands after the resume, and no such call ends
// "ok". Then the end conditions of every scenario.
func TestFrozenRunner(t *testing.T) {
	s := setup(t, conversations)
	frozen := s.startChild("d-frozen", leaseDefault)
	other := s.startChild("d-other", leaseDefault)
	s.WaitFor("stubborn and well-behaved calls in flight in "+frozen.node, func() bool {
		return s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND stubborn AND returned_at IS NULL`, frozen.node) >= 2 &&
			s.Count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND kind IN ('tool', 'once') AND returned_at IS NULL`, frozen.node) >= 2
	})
	// The calls the test follows are those entered before SIGSTOP was sent
	// (their log rows are in; a call entered after it, before the signal
	// landed, may log its entry only after the resume); the fault's window
	// counts from when the child was seen stopped, so that such a call is
	// in flight at the freeze for the proof too (one showed as an overlap,
	// entered 3 ms after the signal was sent).
	frozenAt, stoppedAt := s.freeze(frozen)
	tokens := s.inFlight(frozen.node, frozenAt)
	require.NotEmpty(t, tokens)
	// A statement the node sent before the freeze (a flush's commit) may
	// still land meanwhile and end its runs legitimately: the runs still
	// its own once none of its statements is running are those whose calls
	// must not end ok after the resume.
	s.WaitFor("no statement of "+frozen.node+" running", func() bool {
		return s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query NOT ILIKE 'LISTEN%'`,
			appPrefix+frozen.node) == 0
	})
	live := s.Column(`SELECT token::text FROM {s}.tasks WHERE status = 'running' AND token = ANY($1)`, tokens)
	held := s.Count(`SELECT count(*) FROM {s}.conversations WHERE holder = $1`, frozen.node)
	s.WaitFor("the other runner to take over every run the frozen one had in flight", func() bool {
		return s.Count(`SELECT count(*) FROM {s}.tasks WHERE status = 'running' AND token = ANY($1)`, tokens) == 0
	})
	thawedAt := s.thaw(frozen)
	s.Fault("freeze_past_lease", frozen.node, "", stoppedAt, thawedAt)
	s.WaitSettled()
	s.stopAll()
	s.Verify()

	takenOver := s.Count(`SELECT count(*) FROM {s}.chaos_audit WHERE old_token = ANY($1) AND new_token IS DISTINCT FROM old_token AND app = $2`,
		tokens, appPrefix+other.node)
	landed := s.Count(`SELECT count(*) FROM {s}.chaos_audit WHERE by_token = ANY($1) AND at > $2`, tokens, thawedAt)
	const resumedSQL = `FROM {s}.run_log WHERE node = $1 AND started_at < $2 AND (returned_at IS NULL OR returned_at > $3)`
	resumed := s.Count(`SELECT count(*) `+resumedSQL, frozen.node, frozenAt, thawedAt)
	endedOK := s.Count(`SELECT count(*) `+resumedSQL+` AND outcome = 'ok' AND token::text = ANY($4)`, frozen.node, frozenAt, thawedAt, live)
	refused := s.Count(`SELECT coalesce(sum(refused), 0) `+resumedSQL, frozen.node, frozenAt, thawedAt)
	effects := s.Rows(`SELECT stubborn, count(*) AS side_effects FROM {s}.side_effects e WHERE e.node = $1 AND e.checked_at > $3
		AND e.call_id IN (SELECT id `+resumedSQL+`) GROUP BY stubborn ORDER BY 1`, frozen.node, frozenAt, thawedAt)
	back := s.Rows(`SELECT stubborn, count(*) AS calls,
			round(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY returned_at - $3::timestamptz)))::text || ' ms' AS p50,
			round(1000 * extract(epoch FROM max(returned_at - $3::timestamptz)))::text || ' ms' AS max
		`+resumedSQL+` GROUP BY stubborn ORDER BY 1`, frozen.node, frozenAt, thawedAt)
	t.Logf("(d) frozen with %d runs in flight (%d conversations held) for %s; the other runner recovered %d of their tasks; after the resume %d calls went on, %d of their writes were refused, %d landed; %d ended ok",
		len(tokens), held, thawedAt.Sub(frozenAt).Round(time.Millisecond), takenOver, resumed, refused, landed, endedOK)
	t.Logf("(d) side effects the resumed calls decided after the resume: %v; return after the resume: %v", effects, back)
	require.Positive(t, takenOver, "the other runner took the frozen one's runs over")
	require.Positive(t, resumed, "handlers of the frozen runner went on after the resume")
	require.Positive(t, refused, "the resumed handlers tried to write, and were refused")
	require.Zero(t, landed, "nothing written by a run that was in flight at the freeze landed after the resume")
	require.Zero(t, endedOK, "no call in flight at the freeze ended its run after the resume")
}

// inFlight returns the tokens of the node's calls in flight at the moment
// at (entered before it, not returned by it).
func (s *scenario) inFlight(node string, at time.Time) []int64 {
	s.T.Helper()
	var tokens []int64
	s.Retry("in-flight tokens", func(ctx context.Context) error {
		rows, err := s.Pool.Query(ctx, s.Q(`SELECT DISTINCT token FROM {s}.run_log
			WHERE node = $1 AND started_at < $2 AND (returned_at IS NULL OR returned_at > $2)`), node, at)
		if err != nil {
			return err
		}
		tokens, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	return tokens
}
