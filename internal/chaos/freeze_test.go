package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFrozenRunner (d): two runner processes; one is frozen with SIGSTOP
// while it has tool runs in flight, until the other has taken over every
// run it had in flight (its leases, 1 s, expired; the take-over recovered
// the runs, killing their tokens), then resumed with SIGCONT. Its resumed
// handlers go on — the tools are stubborn, they heartbeat, checkpoint and
// complete whatever they are told — and every one of those writes must be
// refused: nothing stamped by a run that was in flight at the freeze lands
// after the resume, and no such run ends "ok". Then the end conditions of
// every scenario.
func TestFrozenRunner(t *testing.T) {
	s := setup(t, conversations)
	frozen := s.startChild("d-frozen", leaseDefault)
	other := s.startChild("d-other", leaseDefault)
	s.waitFor("tool runs in flight in "+frozen.node, func() bool {
		return s.count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND kind = 'tool' AND ended_at IS NULL`, frozen.node) >= 3
	})
	s.freeze(frozen)
	frozenAt := s.now()
	var tokens []int64
	s.retry("in-flight tokens", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, s.q(`SELECT DISTINCT token FROM {s}.run_log WHERE node = $1 AND ended_at IS NULL`), frozen.node)
		if err != nil {
			return err
		}
		defer rows.Close()
		tokens = tokens[:0]
		for rows.Next() {
			var tok int64
			if err := rows.Scan(&tok); err != nil {
				return err
			}
			tokens = append(tokens, tok)
		}
		return rows.Err()
	})
	require.NotEmpty(t, tokens)
	held := s.count(`SELECT count(*) FROM {s}.conversations WHERE holder = $1`, frozen.node)
	s.waitFor("the other runner to take over every run the frozen one had in flight", func() bool {
		return s.count(`SELECT count(*) FROM {s}.tasks WHERE status = 'running' AND token = ANY($1)`, tokens) == 0
	})
	thawedAt := s.now()
	s.thaw(frozen)
	s.waitSettled()
	s.stopAll()
	s.verify()

	takenOver := s.count(`SELECT count(*) FROM {s}.chaos_audit WHERE old_token = ANY($1) AND new_token IS DISTINCT FROM old_token AND app = $2`,
		tokens, appPrefix+other.node)
	landed := s.count(`SELECT count(*) FROM {s}.chaos_audit WHERE by_token = ANY($1) AND at > $2`, tokens, thawedAt)
	resumed := s.count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND started_at < $2 AND (ended_at IS NULL OR ended_at > $3)`,
		frozen.node, frozenAt, thawedAt)
	endedOK := s.count(`SELECT count(*) FROM {s}.run_log WHERE node = $1 AND started_at < $2 AND ended_at > $3 AND outcome = 'ok'`,
		frozen.node, frozenAt, thawedAt)
	refused := s.count(`SELECT coalesce(sum(refused), 0) FROM {s}.run_log WHERE node = $1 AND started_at < $2 AND (ended_at IS NULL OR ended_at > $3)`,
		frozen.node, frozenAt, thawedAt)
	t.Logf("(d) frozen with %d handler calls in flight (%d conversations held) for %s; the other runner recovered %d of their tasks; after the resume %d calls went on, %d of their writes were refused, %d landed",
		len(tokens), held, thawedAt.Sub(frozenAt).Round(time.Millisecond), takenOver, resumed, refused, landed)
	require.Positive(t, takenOver, "the other runner took the frozen one's runs over")
	require.Positive(t, resumed, "handlers of the frozen runner went on after the resume")
	require.Positive(t, refused, "the resumed handlers tried to write, and were refused")
	require.Zero(t, landed, "nothing written by a run that was in flight at the freeze landed after the resume")
	require.Zero(t, endedOK, "no run in flight at the freeze ended its run after the resume")
}
