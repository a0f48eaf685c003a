package faultharness

import (
	"context"
	"fmt"
)

// A re-entry of an abandon_on_restart handler: a second call, logged in the
// run log (the handler wrapper's entry, written outside arbor before the
// handler does anything), of a task created with AbandonOnRestart — with
// the same token (a run called again, as after an ending whose flush gave
// up with ErrUnavailable) or another (a run started again). Such a task is
// never run twice (docs/operations.md): whatever its run's writes met, its
// handler is entered at most once; its run may end abandoned_on_restart
// instead, when its node lost it. The workload's abandon_on_restart tasks
// (once, and the leaves of a turn created with OnceLeaves) end in their
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
func (s *Scenario) reentries(f *Figures, add func(string, ...any)) {
	f.AORTasks = s.Count(`SELECT count(*) FROM {s}.tasks WHERE abandon_on_restart`)
	f.reentered, f.reentries, f.reentryKinds = 0, 0, nil
	s.Retry("re-entries by kind", func(ctx context.Context) error {
		f.reentered, f.reentries, f.reentryKinds = 0, 0, nil
		rows, err := s.Pool.Query(ctx, s.Q(reentryKindsSQL))
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
	listed := s.Rows(reentrySQL + ` LIMIT 20`)
	for _, row := range listed {
		add("an abandon_on_restart handler entered more than once: %s", row)
	}
	if f.reentered > len(listed) {
		add("… and %d more abandon_on_restart tasks whose handler was entered more than once", f.reentered-len(listed))
	}
}
