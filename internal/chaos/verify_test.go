package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// verify is the end of every scenario, once every task settled and every
// runner process stopped or died. It proves, and fails the test listing
// what breaks each:
//
//   - nothing lost: every turn and every child settled, each with its
//     designed end; every turn completed with the outcomes of its children
//     as designed; no child spawned twice;
//   - no task failed by a fault: the only failed tasks are the doomed ones,
//     with their own message; the only error anywhere else is flaky's
//     designed first failure and the abandoned_on_restart of a once;
//     nothing exceeded its restart limit (set high on purpose, see
//     restartSafe);
//   - abandon_on_restart never ran twice: a once has at most one run_log row;
//   - no two runs of a task live at once (overlapSQL, runLives);
//   - no stale write, every start under the conversation's current lease,
//     and every settled task's end written by its last run
//     (staleWriteQueries);
//   - the invariant checker finds nothing, over every conversation.
//
// It logs the scenario's figures and returns them.
func (s *scenario) verify() figures {
	t := s.t
	t.Helper()
	s.dumpTables()
	require.Zero(t, s.live(), "every task settled")
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	runsOf := s.runLogRows()
	doomedRe, flakyRe := regexp.MustCompile(doomedPattern), regexp.MustCompile(flakyPattern)
	var f figures
	f.conversations = len(s.convs)
	for i, conv := range s.convs {
		var all []arbortype.Task
		s.retry("read "+conv, func(ctx context.Context) error {
			var err error
			all, err = s.engine.ConversationTasks(ctx, conv)
			return err
		})
		f.tasks += len(all)
		if len(all) != tasksPerTurn {
			add("%s: %d tasks, not %d (a child spawned twice, or never)", conv, len(all), tasksPerTurn)
		}
		kinds := map[string]int{}
		var onceStatus arbortype.Status
		for _, task := range all {
			kinds[task.Kind]++
			f.recoveries += task.Attempt
			where := fmt.Sprintf("%s task %d (%s %s)", conv, task.ID, task.Kind, nameOf(task))
			runs := runsOf[task.ID]
			// Errors: only the designed ones, anywhere.
			for _, h := range task.ErrorHistory {
				if !(task.Kind == "doomed" && doomedRe.MatchString(h.Message)) && !(task.Kind == "flaky" && flakyRe.MatchString(h.Message)) {
					add("%s: failed by a fault: error history has %q (code %q)", where, h.Message, h.Code)
				}
			}
			if e := task.Error; e != nil {
				designed := (task.Kind == "doomed" && doomedRe.MatchString(e.Message) && e.Code == "") ||
					(task.Kind == "flaky" && flakyRe.MatchString(e.Message) && e.Code == "") ||
					(task.Kind == "once" && e.Code == abandonedCode)
				if !designed {
					add("%s: failed by a fault: error %q (code %q)", where, e.Message, e.Code)
				}
				if e.Code == restartLimCode {
					add("%s: restart limit exceeded (attempt %d)", where, task.Attempt)
				}
			}
			want := func(status arbortype.Status, value string) {
				if task.Status != status {
					add("%s: %s, want %s (error %+v)", where, task.Status, status, task.Error)
					return
				}
				if value != "" && !jsonEqual(valueOf(task.Result), value) {
					add("%s: result %s, want value %s", where, task.Result, value)
				}
			}
			switch task.Kind {
			case turnKind:
				if task.ID != s.turns[i] {
					add("%s: a second turn", where)
				}
			case "tool":
				want(arbortype.StatusCompleted, fmt.Sprintf(`{"tool": %q}`, nameOf(task)))
			case "group":
				want(arbortype.StatusCompleted, `{"doomed": "failed", "siblings": ["aborted", "aborted"]}`)
			case "sibling":
				want(arbortype.StatusAborted, "")
			case "doomed":
				want(arbortype.StatusFailed, "")
				if task.Error == nil || !task.Error.NonRetryable || task.Retries != 0 {
					add("%s: want a non-retryable failure with no retry, got %+v (retries %d)", where, task.Error, task.Retries)
				}
			case "nap":
				want(arbortype.StatusCompleted, `{"slept": true}`)
			case "flaky":
				want(arbortype.StatusCompleted, `{"retries": 1}`)
				if task.Retries != 1 || len(task.ErrorHistory) != 1 {
					add("%s: want one retry and one failure in its history, got %d and %d", where, task.Retries, len(task.ErrorHistory))
				}
			case "once":
				onceStatus = task.Status
				switch {
				case len(runs) > 1:
					add("%s: abandon_on_restart ran %d times (run_log rows %v)", where, len(runs), runs)
				case task.Status == arbortype.StatusCompleted:
					want(arbortype.StatusCompleted, `{"once": true}`)
					if len(runs) != 1 {
						add("%s: completed with %d runs logged", where, len(runs))
					}
				case task.Status == arbortype.StatusCancelled && task.Error != nil && task.Error.Code == abandonedCode:
					f.abandoned++
				default:
					add("%s: %s (error %+v), want completed or abandoned_on_restart", where, task.Status, task.Error)
				}
			default:
				add("%s: a task of an unknown kind", where)
			}
		}
		for kind, n := range map[string]int{turnKind: 1, "tool": 3, "group": 1, "sibling": 2, "doomed": 1, "nap": 1, "flaky": 1, "once": 1} {
			if kinds[kind] != n {
				add("%s: %d tasks of kind %s, want %d", conv, kinds[kind], kind, n)
			}
		}
		for _, task := range all {
			if task.Kind == turnKind {
				s.checkTurn(task, onceStatus, add)
			}
		}
	}

	s.collect(&f, add)
	for _, q := range staleWriteQueries {
		for _, row := range s.rows(q.sql) {
			add("%s: %s", q.what, row)
		}
	}
	for _, row := range s.rows(overlapSQL) {
		add("two runs of a task at once: %s", row)
	}

	var vs []string
	s.retry("check", func(ctx context.Context) error {
		found, err := s.engine.Check(ctx)
		vs = vs[:0]
		for _, v := range found {
			vs = append(vs, v.String())
		}
		return err
	})
	for _, v := range vs {
		add("checker: %s", v)
	}

	f.took = time.Since(s.began)
	f.log(t)
	s.logSummary(t)
	if len(problems) > 60 {
		problems = append(problems[:60], fmt.Sprintf("… and %d more", len(problems)-60))
	}
	require.Empty(t, problems, "\n%s", strings.Join(problems, "\n"))
	return f
}

// checkTurn compares a turn's result with its children's designed ends.
func (s *scenario) checkTurn(turn arbortype.Task, onceStatus arbortype.Status, add func(string, ...any)) {
	where := fmt.Sprintf("%s turn %d", turn.ConversationID, turn.ID)
	if turn.Status != arbortype.StatusCompleted {
		add("%s: %s, want completed (error %+v)", where, turn.Status, turn.Error)
		return
	}
	once := `{"status": "completed", "value": {"once": true}}`
	if onceStatus == arbortype.StatusCancelled {
		once = `{"status": "cancelled", "value": null}`
	}
	want := fmt.Sprintf(`{
		"tool0": {"status": "completed", "value": {"tool": "tool0"}},
		"tool1": {"status": "completed", "value": {"tool": "tool1"}},
		"tool2": {"status": "completed", "value": {"tool": "tool2"}},
		"group": {"status": "completed", "value": {"doomed": "failed", "siblings": ["aborted", "aborted"]}},
		"nap":   {"status": "completed", "value": {"slept": true}},
		"flaky": {"status": "completed", "value": {"retries": 1}},
		"once":  %s}`, once)
	if got := valueOf(turn.Result); !jsonEqual(got, want) {
		add("%s: result %s, want %s", where, got, strings.Join(strings.Fields(want), " "))
	}
}

func jsonEqual(got json.RawMessage, want string) bool {
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal([]byte(want), &b) != nil {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// runLogRows returns the run_log ids of every task.
func (s *scenario) runLogRows() map[int64][]int64 {
	out := map[int64][]int64{}
	s.retry("read run_log", func(ctx context.Context) error {
		clear(out)
		rows, err := s.pool.Query(ctx, s.q(`SELECT task_id, id FROM {s}.run_log ORDER BY started_at`))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var task, id int64
			if err := rows.Scan(&task, &id); err != nil {
				return err
			}
			out[task] = append(out[task], id)
		}
		return rows.Err()
	})
	return out
}

// rows runs a query and returns each row as text.
func (s *scenario) rows(sql string) []string {
	var out []string
	s.retry(sql, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.pool.Query(ctx, s.q(sql))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				parts[i] = fmt.Sprintf("%s=%v", rows.FieldDescriptions()[i].Name, v)
			}
			out = append(out, strings.Join(parts, " "))
		}
		return rows.Err()
	})
	return out
}

// A run's life, in the run log: from the start of its handler call to the
// moment it issued its ending write, or to its process's death, or — for a
// run cut off by a take-over while its handler still went on (a frozen or
// partitioned runner) — to the moment its token died: the take-over's
// recovery is the write that ended that run (docs/design.md §1, "run";
// docs/guarantees.md, "No two runs at once": a handler still computing
// when its task is taken over is not stopped by the database, its writes
// are refused). What such a handler does afterwards is covered by the
// stale-write proof instead: nothing it writes lands. Two rows of one task
// whose lives overlap are two live runs at once.
const runLives = `WITH lives AS (
	SELECT r.id, r.task_id, r.token, r.node, r.started_at,
		coalesce(r.ended_at, n.died_at, 'infinity') AS wall_end,
		least(coalesce(r.ended_at, n.died_at, 'infinity'), coalesce(d.at, 'infinity')) AS end_at
	FROM {s}.run_log r
	LEFT JOIN {s}.chaos_nodes n ON n.node = r.node
	LEFT JOIN LATERAL (SELECT min(a.at) AS at FROM {s}.chaos_audit a
		WHERE a.task_id = r.task_id AND a.old_token = r.token AND a.new_token IS DISTINCT FROM r.token) d ON true)`

const overlapSQL = runLives + `
SELECT x.task_id, x.id AS run, x.token, x.node, x.started_at, x.end_at, y.id AS other, y.token AS other_token,
	y.node AS other_node, y.started_at AS other_started
FROM lives x JOIN lives y ON x.task_id = y.task_id AND (x.started_at, x.id) < (y.started_at, y.id)
WHERE x.started_at < x.end_at AND y.started_at < y.end_at AND y.started_at < x.end_at
ORDER BY x.task_id LIMIT 20`

// staleWriteQueries each return the writes that break a rule.
var staleWriteQueries = []struct{ what, sql string }{
	{"a write that landed from a run whose token was not the task's current one", `
		SELECT a.id AS audit, a.task_id, a.op, a.old_status, a.old_token, a.owner_status, a.owner_token,
			a.by_token, a.by_node, a.app, a.at
		FROM {s}.chaos_audit a
		WHERE a.by_token IS NOT NULL AND CASE WHEN a.op = 'insert'
			THEN a.owner_status IS DISTINCT FROM 'running' OR a.owner_token IS DISTINCT FROM a.by_token
			ELSE a.old_status IS DISTINCT FROM 'running' OR a.old_token IS DISTINCT FROM a.by_token END
		ORDER BY a.id LIMIT 20`},
	{"a run's write that landed through another process than the run's", `
		SELECT a.id AS audit, a.task_id, a.by_token, a.by_node, a.app
		FROM {s}.chaos_audit a
		WHERE a.by_node IS NOT NULL AND a.app IS DISTINCT FROM '` + appPrefix + `' || a.by_node
		ORDER BY a.id LIMIT 20`},
	{"a write stamped by a run the run log does not know", `
		SELECT a.id AS audit, a.task_id, a.op, a.by_token, a.by_node
		FROM {s}.chaos_audit a LEFT JOIN {s}.tasks c ON a.op = 'insert' AND c.id = a.task_id
		WHERE a.by_token IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.run_log r
			WHERE r.token = a.by_token AND r.node = coalesce(a.by_node, r.node)
			  AND r.task_id = CASE WHEN a.op = 'insert' THEN c.owner_task_id ELSE a.task_id END)
		ORDER BY a.id LIMIT 20`},
	{"a start that was not under the conversation's current lease, or not by its holder's process", `
		SELECT a.id AS audit, a.task_id, a.new_token, a.new_run_epoch, a.conv_epoch, a.conv_holder, a.app
		FROM {s}.chaos_audit a
		WHERE a.new_status = 'running' AND a.old_status IS DISTINCT FROM 'running'
		  AND (a.new_run_epoch IS DISTINCT FROM a.conv_epoch OR a.app IS DISTINCT FROM '` + appPrefix + `' || a.conv_holder)
		ORDER BY a.id LIMIT 20`},
	{"a settled task whose end was not written by its last run", `
		SELECT t.id AS task, t.kind, t.status, e.token AS end_token, m.token AS last_run_token
		FROM {s}.tasks t
		CROSS JOIN LATERAL (SELECT CASE t.status
			WHEN 'completed' THEN (t.result->'by'->>'token')::bigint
			WHEN 'failed' THEN substring(t.error->>'message' from '\(token ([0-9]+)\)$')::bigint END AS token) e
		CROSS JOIN LATERAL (SELECT max(r.token) AS token FROM {s}.run_log r WHERE r.task_id = t.id) m
		WHERE t.status IN ('completed', 'failed') AND e.token IS DISTINCT FROM m.token
		ORDER BY t.id LIMIT 20`},
}

// idleRunSQL finds the run that stayed live (its token the task's) longest
// after its last handler call ended (or its process died), or from its
// start when no call of it was logged: time in which the task was running
// for nobody. A take-over after a kill costs about a lease; much more is
// a run left behind by its runner.
const idleRunSQL = `WITH starts AS (
	SELECT a.task_id, a.new_token AS token, a.at AS born,
		(SELECT min(d.at) FROM {s}.chaos_audit d WHERE d.task_id = a.task_id AND d.old_token = a.new_token
			AND d.new_token IS DISTINCT FROM a.new_token) AS died
	FROM {s}.chaos_audit a WHERE a.new_status = 'running' AND a.old_status IS DISTINCT FROM 'running'),
idle AS (
	SELECT st.task_id, st.token, st.died - greatest(st.born, max(coalesce(r.ended_at, n.died_at, st.born))) AS idle
	FROM starts st LEFT JOIN {s}.run_log r ON r.token = st.token LEFT JOIN {s}.chaos_nodes n ON n.node = r.node
	GROUP BY st.task_id, st.token, st.born, st.died)
SELECT round(extract(epoch FROM i.idle)::numeric, 3) || ' s' AS idle, i.task_id, t.kind, i.token FROM idle i JOIN {s}.tasks t ON t.id = i.task_id
WHERE i.idle IS NOT NULL ORDER BY i.idle DESC LIMIT 1`

// figures are a scenario's numbers, for its log.
type figures struct {
	conversations, tasks, runLog, runs, recoveries, abandoned   int
	contentWrites, starts, cut, outlived, refused, wallOverlaps int
	idleRun                                                     []string
	faults                                                      []string
	took                                                        time.Duration
}

// collect reads the figures the run log and the audit hold.
func (s *scenario) collect(f *figures, add func(string, ...any)) {
	f.runLog = s.count(`SELECT count(*) FROM {s}.run_log`)
	f.runs = s.count(`SELECT count(DISTINCT token) FROM {s}.run_log`)
	f.refused = s.count(`SELECT coalesce(sum(refused), 0) FROM {s}.run_log`)
	f.cut = s.count(`SELECT count(*) FROM {s}.run_log r JOIN {s}.chaos_nodes n USING (node) WHERE r.ended_at IS NULL`)
	f.contentWrites = s.count(`SELECT count(*) FROM {s}.chaos_audit WHERE by_token IS NOT NULL`)
	f.starts = s.count(`SELECT count(*) FROM {s}.chaos_audit WHERE new_status = 'running' AND old_status IS DISTINCT FROM 'running'`)
	f.outlived = s.count(runLives + ` SELECT count(*) FROM lives l JOIN {s}.run_log r USING (id) WHERE r.ended_at > l.end_at`)
	f.wallOverlaps = s.count(runLives + ` SELECT count(*) FROM lives x JOIN lives y
		ON x.task_id = y.task_id AND (x.started_at, x.id) < (y.started_at, y.id) WHERE y.started_at < x.wall_end`)
	f.idleRun = s.rows(idleRunSQL)
	if f.contentWrites == 0 || f.starts == 0 {
		add("the audit recorded %d stamped writes and %d starts: the proof would be empty", f.contentWrites, f.starts)
	}
}

func (f figures) log(t interface{ Logf(string, ...any) }) {
	t.Logf("figures: %d conversations, %d tasks; %d runs (%d handler calls), %d starts, %d recoveries, %d once abandoned",
		f.conversations, f.tasks, f.runs, f.runLog, f.starts, f.recoveries, f.abandoned)
	t.Logf("figures: %d stamped writes audited; %d handler calls cut by a kill; %d handler calls outlived their token (cut off by a take-over while running; %d wall-clock overlaps with a later run); %d writes refused",
		f.contentWrites, f.cut, f.outlived, f.wallOverlaps, f.refused)
	t.Logf("figures: longest a run stayed live with no handler call of it going on: %s", strings.Join(f.idleRun, ""))
	if len(f.faults) > 0 {
		sort.Strings(f.faults)
		t.Logf("figures: faults: %s", strings.Join(f.faults, "; "))
	}
	t.Logf("figures: took %s", f.took.Round(100*time.Millisecond))
}
