package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// A re-entry of an abandon_on_restart handler: a second call, logged in the
// run log (the handler wrapper's entry, written outside arbor before the
// handler does anything), of a task created with AbandonOnRestart — with
// the same token (a run called again, as after an ending whose flush gave
// up with ErrUnavailable) or another (a run started again). Such a task is
// never run twice (docs/operations.md): whatever its run's writes met, its
// handler is entered at most once; its run may end abandoned_on_restart
// instead, when its node lost it. The workload's abandon_on_restart tasks
// (once, and the leaves of a turn created with onceLeaves) end in their
// first call — no wait, no sleep, no retry — so every call after the first
// is a re-entry; a kind that waited, slept or retried would be entered once
// per phase or retry, and would need those told apart here.
const reentrySQL = `SELECT r.task_id, t.kind, t.status, count(*) AS entries, count(DISTINCT r.token) AS tokens,
	string_agg(to_char(r.started_at, 'HH24:MI:SS.MS') || ' ' || r.node || ' token ' || r.token || ' → '
		|| coalesce(to_char(r.returned_at, 'HH24:MI:SS.MS') || ' ' || left(r.outcome, 160), 'no return'),
		' | ' ORDER BY r.started_at, r.id) AS calls
	FROM {s}.run_log r JOIN {s}.tasks t ON t.id = r.task_id
	WHERE t.abandon_on_restart
	GROUP BY r.task_id, t.kind, t.status HAVING count(*) > 1
	ORDER BY r.task_id`

// reentryKindsSQL sums the re-entries by kind: the tasks re-entered, the
// calls after their first, and of those tasks how many were called again
// with the same token (the same run entered twice).
const reentryKindsSQL = `SELECT kind, count(*), sum(entries - 1), count(*) FILTER (WHERE entries > tokens)
	FROM (SELECT r.task_id, t.kind, count(*) AS entries, count(DISTINCT r.token) AS tokens
		FROM {s}.run_log r JOIN {s}.tasks t ON t.id = r.task_id
		WHERE t.abandon_on_restart GROUP BY r.task_id, t.kind HAVING count(*) > 1) x
	GROUP BY kind ORDER BY kind`

// reentries counts the re-entries of abandon_on_restart handlers into f,
// and adds a problem for each re-entered task (the first 20 listed with
// their calls: entry, node, token, return and outcome).
func (s *scenario) reentries(f *figures, add func(string, ...any)) {
	f.aorTasks = s.count(`SELECT count(*) FROM {s}.tasks WHERE abandon_on_restart`)
	f.reentered, f.reentries, f.reentryKinds = 0, 0, nil
	s.retry("re-entries by kind", func(ctx context.Context) error {
		f.reentered, f.reentries, f.reentryKinds = 0, 0, nil
		rows, err := s.pool.Query(ctx, s.q(reentryKindsSQL))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var kind string
			var tasks, calls, sameToken int
			if err := rows.Scan(&kind, &tasks, &calls, &sameToken); err != nil {
				return err
			}
			f.reentered += tasks
			f.reentries += calls
			f.reentryKinds = append(f.reentryKinds,
				fmt.Sprintf("%s: %d tasks, %d calls after the first, %d tasks with a run entered twice", kind, tasks, calls, sameToken))
		}
		return rows.Err()
	})
	listed := s.rows(reentrySQL + ` LIMIT 20`)
	for _, row := range listed {
		add("an abandon_on_restart handler entered more than once: %s", row)
	}
	if f.reentered > len(listed) {
		add("… and %d more abandon_on_restart tasks whose handler was entered more than once", f.reentered-len(listed))
	}
}

// TestProofCatchesReentries checks the re-entry check: a second call of an
// abandon_on_restart task, logged by hand, is a re-entry, with the same
// token or another; second calls of other tasks are not.
func TestProofCatchesReentries(t *testing.T) {
	s := setup(t, 1)
	once, _, err := s.engine.Create(s.ctx, arbortype.CreateParams{ConversationID: "reentry", Kind: "once", AbandonOnRestart: true})
	require.NoError(t, err)
	at := time.Now()
	call := func(id, task, token int64, kind string) {
		s.exec(`INSERT INTO {s}.run_log (id, task_id, conversation_id, token, node, kind, stubborn, attempt, started_at, returned_at, outcome)
			VALUES ($1, $2, 'c', $3, 'x', $4, false, 0, $5, $6, 'ok')`, id, task, token, kind, at.Add(time.Duration(id)*time.Second),
			at.Add(time.Duration(id)*time.Second+time.Millisecond))
	}
	check := func(reentered, reentries int) []string {
		t.Helper()
		var f figures
		var problems []string
		s.reentries(&f, func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) })
		require.Equal(t, 1, f.aorTasks, "the abandon_on_restart tasks")
		require.Equal(t, reentered, f.reentered, "tasks re-entered")
		require.Equal(t, reentries, f.reentries, "calls after the first")
		require.Len(t, problems, reentered, strings.Join(problems, "\n"))
		return f.reentryKinds
	}

	call(1, once.ID, 7, "once")
	call(2, s.turns[0], 8, turnKind)
	call(3, s.turns[0], 8, turnKind) // not abandon_on_restart: no re-entry
	check(0, 0)

	call(4, once.ID, 7, "once") // the same run entered again
	kinds := check(1, 1)
	require.Equal(t, []string{"once: 1 tasks, 1 calls after the first, 1 tasks with a run entered twice"}, kinds)

	call(5, once.ID, 9, "once") // a run started again
	check(1, 2)
}
