package faultharness

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
)

// setup gives a test of the proof a scenario of one conversation, whose
// turn no runner runs: the test writes the run log, the faults and the
// task rows by hand. Unlike the suites' scenarios, these tests make no
// fault, so they run under `make test`.
func setup(t *testing.T) *Scenario {
	s := New(t, Config{AppPrefix: "arbor-proof-", Conversations: "proof"})
	s.AddTurns(1, nil)
	return s
}

// TestProofCatchesViolations checks the checks: the end-of-scenario queries
// find a write that landed with a dead token, two calls of a task whose
// intervals from entry to return intersect, a side effect decided after
// another call of its task started, and a restart that no fault explains,
// when the test makes them by hand (no runner involved) — and the
// exemptions and explanations, when the test records the faults that
// account for them.
func TestProofCatchesViolations(t *testing.T) {
	t.Parallel()
	s := setup(t)
	e := enginetest.Wrap(s.Engine)
	first, err := e.Start(s.Ctx, s.Turns[0])
	require.NoError(t, err)
	_, err = e.Recover(s.Ctx, s.Turns[0]) // the first run's token dies: a restart
	require.NoError(t, err)
	second, err := e.Start(s.Ctx, s.Turns[0])
	require.NoError(t, err)

	// A write stamped by the first run lands behind the engine's back.
	s.Exec(fmt.Sprintf(`UPDATE {s}.tasks SET state = '{"by": {"token": %d, "node": "x"}}' WHERE id = $1`, first.Token), s.Turns[0])
	stale := s.Rows(staleWriteQueries[0].sql)
	require.Len(t, stale, 1, "the stale write is found")
	require.Contains(t, stale[0], fmt.Sprintf("old_token=%d", second.Token))
	require.Contains(t, stale[0], fmt.Sprintf("by_token=%d", first.Token))
	// The run's own write is not.
	s.Exec(fmt.Sprintf(`UPDATE {s}.tasks SET state = '{"by": {"token": %d, "node": "x"}}' WHERE id = $1`, second.Token), s.Turns[0])
	require.Len(t, s.Rows(staleWriteQueries[0].sql), 1, "a write of the current run is no stale write")

	// The recovery is a restart that nothing explains, until a fault of
	// its conversation overlapping the run is recorded.
	recs := s.recoveries()
	require.Len(t, recs, 1, "the recovery is a restart counted")
	require.Empty(t, recs[0].explainedBy, "no fault explains it")
	s.Fault("lock", "", s.Convs[0], recs[0].started.Add(-time.Second), recs[0].recovered)
	require.Equal(t, "lock", s.recoveries()[0].explainedBy, "the lock explains it")

	// A kill of the run's node explains it even when the start landed
	// after the kill (a create's statement the server ran after its client
	// died); a kill of another node before the start does not.
	// The start is made node k's, by hand.
	s.Exec(`DELETE FROM {s}.chaos_faults`)
	app := s.Column(`SELECT app FROM {s}.chaos_audit WHERE new_token = $1 AND new_status = 'running'`, first.Token)
	require.Len(t, app, 1)
	s.Exec(`UPDATE {s}.chaos_audit SET app = 'arbor-proof-k' WHERE new_token = $1 AND new_status = 'running'`, first.Token)
	require.Equal(t, "k", s.recoveries()[0].node)
	before := recs[0].started.Add(-time.Second)
	s.Fault("kill", "j", "", before, before)
	require.Empty(t, s.recoveries()[0].explainedBy, "another node's kill does not explain it")
	s.Fault("kill", "k", "", before, before)
	require.Equal(t, "kill", s.recoveries()[0].explainedBy, "a kill of its node explains it, though it came before the start")
	s.Exec(`DELETE FROM {s}.chaos_faults`)
	s.Exec(`UPDATE {s}.chaos_audit SET app = $2 WHERE new_token = $1 AND new_status = 'running'`, first.Token, app[0])
	s.Fault("lock", "", s.Convs[0], recs[0].started.Add(-time.Second), recs[0].recovered)

	// Calls of task -1 (the clock: at + the offsets): 1 and 2 intersect, 3
	// enters as 2 returns; 4, on node "k", entered before 3 and never
	// returned — until "k" is recorded killed at 3's entry.
	at := time.Now()
	call := func(id int64, node string, stubborn bool, start, end time.Duration) {
		var ended *time.Time
		if end >= 0 {
			e := at.Add(end)
			ended = &e
		}
		s.Exec(`INSERT INTO {s}.run_log (id, task_id, conversation_id, token, node, kind, stubborn, attempt, started_at, returned_at)
			VALUES ($1, -1, 'c', $1, $2, 'k', $3, 0, $4, $5)`, id, node, stubborn, at.Add(start), ended)
	}
	call(1, "x", false, 0, 2*time.Second)
	call(2, "y", false, time.Second, 3*time.Second)
	call(3, "x", false, 3*time.Second, 4*time.Second)
	call(4, "k", false, 2500*time.Millisecond, -1)
	overlaps := s.Rows(overlapSQL)
	require.Len(t, overlaps, 3, strings.Join(overlaps, "\n"))
	require.Contains(t, overlaps[0], "call=1 ")
	require.Contains(t, overlaps[0], "other=2 ")
	require.Len(t, s.Rows(neverReturnedSQL), 1, "call 4 never returned")
	s.Fault("kill", "k", "", at.Add(3*time.Second), at.Add(3*time.Second))
	require.Len(t, s.Rows(overlapSQL), 2, "a killed call ends at its process's death: 4 no longer overlaps 3")
	require.Empty(t, s.Rows(neverReturnedSQL), "a killed call has no return")

	// Call 1 frozen past the lease is exempt, and a stubborn call overlapping
	// one on another node is counted apart.
	s.Fault("freeze_past_lease", "x", "", at.Add(500*time.Millisecond), at.Add(1500*time.Millisecond))
	call(5, "z", true, 5*time.Second, 7*time.Second)
	call(6, "w", false, 6*time.Second, 8*time.Second)
	overlaps = s.Rows(overlapSQL)
	require.Len(t, overlaps, 1, strings.Join(overlaps, "\n"))
	require.Contains(t, overlaps[0], "call=2 ", "2 overlapping 4 is left")
	require.Equal(t, 1, s.Count(overlapPairs+` SELECT count(*) FROM pairs WHERE class = 'frozen'`))
	require.Equal(t, 1, s.Count(overlapPairs+` SELECT count(*) FROM pairs WHERE class = 'stubborn'`))

	// Side effects of call 1: one decided before 2 entered, one after —
	// found, frozen or not.
	for i, off := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond} {
		s.Exec(`INSERT INTO {s}.side_effects (id, call_id, task_id, node, what, stubborn, checked_at) VALUES ($1, 1, -1, 'x', 'step', false, $2)`,
			int64(i+1), at.Add(off))
	}
	after := s.Rows(effectsAfterSQL)
	require.Len(t, after, 1, strings.Join(after, "\n"))
	require.Contains(t, after[0], "other=2 ")
}

// TestProofCatchesReentries checks the re-entry check: a second call of an
// abandon_on_restart task, logged by hand, is a re-entry, with the same
// token or another; second calls of other tasks are not.
func TestProofCatchesReentries(t *testing.T) {
	t.Parallel()
	s := setup(t)
	once, _, err := s.Engine.Create(s.Ctx, arbortype.CreateParams{ConversationID: "reentry", Kind: "once", AbandonOnRestart: true})
	require.NoError(t, err)
	at := time.Now()
	call := func(id, task, token int64, kind string) {
		s.Exec(`INSERT INTO {s}.run_log (id, task_id, conversation_id, token, node, kind, stubborn, attempt, started_at, returned_at, outcome)
			VALUES ($1, $2, 'c', $3, 'x', $4, false, 0, $5, $6, 'ok')`, id, task, token, kind, at.Add(time.Duration(id)*time.Second),
			at.Add(time.Duration(id)*time.Second+time.Millisecond))
	}
	check := func(reentered, reentries int) []string {
		t.Helper()
		var f Figures
		var problems []string
		s.reentries(&f, func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) })
		require.Equal(t, 1, f.AORTasks, "the abandon_on_restart tasks")
		require.Equal(t, reentered, f.reentered, "tasks re-entered")
		require.Equal(t, reentries, f.reentries, "calls after the first")
		require.Len(t, problems, reentered, strings.Join(problems, "\n"))
		return f.reentryKinds
	}

	call(1, once.ID, 7, "once")
	call(2, s.Turns[0], 8, TurnKind)
	call(3, s.Turns[0], 8, TurnKind) // not abandon_on_restart: no re-entry
	check(0, 0)

	call(4, once.ID, 7, "once") // the same run entered again
	kinds := check(1, 1)
	require.Equal(t, []string{"once: 1 tasks, 1 calls after the first, 1 tasks with a run entered twice"}, kinds)

	call(5, once.ID, 9, "once") // a run started again
	check(1, 2)
}

// TestProofCountsRestarts checks how the proof counts recoveries: each
// one a fault explains is a restart counted, each one none explains a
// problem too; in a scenario of database faults alone, no fault explains
// any, and an abandoned_on_restart is counted apart.
func TestProofCountsRestarts(t *testing.T) {
	t.Parallel()
	recs := []recovery{
		{task: 1, kind: "once", status: "cancelled", code: abandonedCode, explainedBy: "restart"},
		{task: 2, kind: "tool", status: "pending", explainedBy: "kill"},
		{task: 3, kind: "tool", status: "pending"},
	}
	for _, tc := range []struct {
		dbOnly                                   bool
		restarts, explained, abandoned, problems int
	}{
		{dbOnly: false, restarts: 3, explained: 2, abandoned: 0, problems: 1},
		{dbOnly: true, restarts: 2, explained: 0, abandoned: 1, problems: 2},
	} {
		s := &Scenario{cfg: Config{DatabaseFaultsOnly: tc.dbOnly}}
		rs := slices.Clone(recs)
		if tc.dbOnly {
			for i := range rs {
				rs[i].explainedBy = "" // as Verify does
			}
		}
		var f Figures
		var problems []string
		s.countRestarts(rs, &f, func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) })
		require.Equal(t, tc.restarts, f.Restarts, "database faults only: %v", tc.dbOnly)
		require.Equal(t, tc.explained, f.explained, "database faults only: %v", tc.dbOnly)
		require.Equal(t, tc.restarts-tc.explained, f.unexplained, "database faults only: %v", tc.dbOnly)
		require.Equal(t, tc.abandoned, f.abandonedRecoveries, "database faults only: %v", tc.dbOnly)
		require.Len(t, problems, tc.problems, strings.Join(problems, "\n"))
	}
}

// TestProofCatchesLimitOvershoot checks the limits' proof: three calls of
// tasks of key "search" in flight at once, under a limit of 2, are an
// overshoot; two that touch are counted together; a call that never
// returned is in flight until its process's death, which bounds it only
// when it came after its entry; and a slot counted with no run left is a
// leak.
func TestProofCatchesLimitOvershoot(t *testing.T) {
	t.Parallel()
	s := setup(t)
	require.NoError(t, s.Engine.SetConcurrencyLimit(s.Ctx, "key:search", 2))
	var ids []int64
	for i := range 3 {
		task, _, err := s.Engine.Create(s.Ctx, arbortype.CreateParams{ConversationID: fmt.Sprint("limit-", i), Kind: "tool",
			ConcurrencyKey: "search"})
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	at := time.Now()
	call := func(id int64, task int64, node string, start, end time.Duration) {
		var ended *time.Time
		if end >= 0 {
			e := at.Add(end)
			ended = &e
		}
		s.Exec(`INSERT INTO {s}.run_log (id, task_id, conversation_id, token, node, kind, stubborn, attempt, started_at, returned_at)
			VALUES ($1, $2, 'c', $1, $3, 'tool', false, 0, $4, $5)`, id, task, node, at.Add(start), ended)
	}
	sampled := map[string]LimitSample{"key:search": {Max: 2, Samples: 1}}
	check := func(inFlight int, problems int) {
		t.Helper()
		out, found := s.limitProblems(sampled, nil)
		require.Equal(t, inFlight, out["key:search"].InFlight, strings.Join(found, "\n"))
		require.Len(t, found, problems, strings.Join(found, "\n"))
	}
	call(1, ids[0], "x", 0, time.Second)
	call(2, ids[1], "y", time.Second, 3*time.Second) // enters as 1 returns: touching counts
	check(2, 0)
	call(3, ids[2], "k", 500*time.Millisecond, -1) // never returns: in flight to the end
	check(3, 1)
	s.Fault("kill", "k", "", at.Add(900*time.Millisecond), at.Add(900*time.Millisecond))
	check(2, 0) // killed before 2 entered
	s.Exec(`UPDATE {s}.chaos_faults SET from_at = $1, to_at = $1 WHERE node = 'k'`, at.Add(1500*time.Millisecond))
	check(3, 1) // killed after 2 entered

	s.Exec(`UPDATE {s}.chaos_faults SET from_at = $1, to_at = $1 WHERE node = 'k'`, at.Add(900*time.Millisecond))
	s.Exec(`UPDATE {s}.concurrency_limits SET running = 1 WHERE key = 'key:search'`)
	out, found := s.limitProblems(sampled, nil)
	require.Equal(t, 1, out["key:search"].Running)
	require.Len(t, found, 1, strings.Join(found, "\n"))
	require.Contains(t, found[0], "1 slots leaked")
}
