package faultharness

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// Verify is the end of every scenario, once every task settled and every
// runner stopped or died (and, with UseOutside, every worker's record
// landed: Worker.Wait). It proves, and fails the test listing what breaks
// each:
//
//   - nothing lost: every turn and every child settled, each with its
//     designed end; every turn completed with the outcomes of its children
//     as designed (with awaits, its agent's approval and its waiter's
//     timeout included); no child spawned twice; with awaits, every
//     conversation's budget spent as its agent recorded, nothing left
//     reserved (checkBudget), and every approval an Emit acknowledged in
//     the database;
//   - no task failed by a fault: the only failed tasks are the doomed ones,
//     with their own message; the only error anywhere else is flaky's
//     designed first failure and the abandoned_on_restart of an
//     abandon_on_restart task whose run a fault cut;
//     restart_limit_exceeded only for a task whose runs kills, freezes,
//     cuts or locks really cut more often than its restart limit (the
//     engine's default) — a slow machine makes runs longer and so cut more
//     often by the same kills — and then its conversation's other
//     outcomes, which that failure changes (its subtree aborted, children
//     never spawned), are not compared with the designed ones;
//   - no restart that no fault explains: every recovery (attempt + 1,
//     abandoned_on_restart, restart_limit_exceeded) is of a run that a kill
//     or freeze of its node, a cut of its node's route, or a lock of its
//     conversation's row overlapped (recoveriesSQL; a kill, any run of its
//     node recovered after it, even one a create started in a statement
//     the server ran after its client died); in a scenario of
//     backend terminations or server restarts there is none; in a scenario
//     of database faults alone (Config.DatabaseFaultsOnly) none is
//     explained, and an abandoned_on_restart is counted apart;
//   - no abandon_on_restart handler entered twice: a task created
//     abandon_on_restart (once, and the leaves of a turn that asks for
//     it) has at most one call in the run log, whatever the call's writes
//     met (reentrySQL; Figures' reentries, in every scenario);
//   - no two calls of a task at once: no two calls of one task whose
//     intervals from entry to return (to its process's death, if killed)
//     intersect (overlapPairs) — but for a call in flight while its
//     process was frozen past the lease (nothing can stop a process that
//     does not run) and a stubborn call overlapping a call on another node
//     (nothing can stop a handler that ignores its context), counted apart;
//   - no side effect after another call of its task started: a
//     well-behaved call decides no side effect after a later call's entry
//     (effectsAfter), the frozen ones included; the stubborn kind's are
//     counted apart;
//   - every call returned, but those of a killed process;
//   - no stale write, every start under the conversation's current lease,
//     and every settled task's end written by its last run
//     (staleWriteQueries);
//   - the invariant checker finds nothing, over every conversation.
//
// It logs the scenario's figures and returns them; what it finds fails the
// test, but lets the scenario's own checks and figures run after it.
func (s *Scenario) Verify() Figures {
	t := s.T
	t.Helper()
	if s.outside != nil {
		s.importLogs()
	}
	s.DumpTables()
	require.Empty(t, s.lostEmits(), "every emit acknowledged is in the database")
	require.Zero(t, s.Live(), "every task settled")
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var f Figures
	faulty := map[int64]bool{} // tasks failed by a fault
	fault := func(id int64, format string, args ...any) {
		faulty[id] = true
		add(format, args...)
	}

	recs := s.recoveries()
	if s.cfg.DatabaseFaultsOnly {
		// No runner died, no conversation was locked: nothing explains a
		// restart.
		for i := range recs {
			recs[i].explainedBy = ""
		}
	}
	perTask := map[int64]*taskRecoveries{}
	for _, r := range recs {
		tr := perTask[r.task]
		if tr == nil {
			tr = &taskRecoveries{}
			perTask[r.task] = tr
		}
		if r.explainedBy != "" {
			tr.explained++
		} else {
			tr.unexplained++
		}
	}

	callsOf := s.callsPerTask()
	doomedRe, flakyRe := regexp.MustCompile(doomedPattern), regexp.MustCompile(flakyPattern)
	f.conversations = len(s.Convs)
	for i, conv := range s.Convs {
		var all []arbortype.Task
		s.Retry("read "+conv, func(ctx context.Context) error {
			var err error
			all, err = s.Engine.ConversationTasks(ctx, conv)
			return err
		})
		f.tasks += len(all)
		// A task whose runs faults really cut more often than its restart
		// limit fails with restart_limit_exceeded (design.md §3.8), and its
		// subtree is aborted with it, its owners' results change, children
		// it had yet to spawn never come: that conversation's outcomes are
		// not compared with the designed ones, only its errors (each must
		// be designed, or that exceeded limit), its runs, its restarts and
		// the invariants, as every conversation's are.
		legit := func(task arbortype.Task) bool {
			tr := perTask[task.ID]
			return tr != nil && tr.unexplained == 0 && tr.explained > task.RestartLimit
		}
		exceeded := false
		for _, task := range all {
			if task.Error != nil && task.Error.Code == restartLimCode && legit(task) {
				exceeded = true
			}
		}
		if want := tasksPerTurn(s.cfg.Awaits) + s.fans[i]; len(all) != want && !exceeded {
			add("%s: %d tasks, not %d (a child spawned twice, or never)", conv, len(all), want)
		}
		kinds := map[string]int{}
		var onceStatus arbortype.Status
		leaves := 0 // leaves not abandoned
		for _, task := range all {
			kinds[task.Kind]++
			f.Attempts += task.Attempt
			where := fmt.Sprintf("%s task %d (%s %s)", conv, task.ID, task.Kind, nameOf(task))
			// Errors: only the designed ones, anywhere.
			for _, h := range task.ErrorHistory {
				if h.Code == restartLimCode && legit(task) {
					continue
				}
				if !(task.Kind == "doomed" && doomedRe.MatchString(h.Message)) && !(task.Kind == "flaky" && flakyRe.MatchString(h.Message)) {
					fault(task.ID, "%s: failed by a fault: error history has %q (code %q)", where, h.Message, h.Code)
				}
			}
			if e := task.Error; e != nil {
				tr := perTask[task.ID]
				switch {
				case e.Code == restartLimCode && legit(task):
					t.Logf("%s: restart limit %d exceeded, accepted: %d of its runs were cut by faults", where, task.RestartLimit, tr.explained)
					continue
				case e.Code == restartLimCode:
					explained := 0
					if tr != nil {
						explained = tr.explained
					}
					fault(task.ID, "%s: restart limit %d exceeded (attempt %d) with only %d of its runs cut by a kill, freeze, cut or lock",
						where, task.RestartLimit, task.Attempt, explained)
					continue
				}
				designed := (task.Kind == "doomed" && doomedRe.MatchString(e.Message) && e.Code == "") ||
					(task.Kind == "flaky" && flakyRe.MatchString(e.Message) && e.Code == "") ||
					(task.AbandonOnRestart && e.Code == abandonedCode)
				if !designed {
					fault(task.ID, "%s: failed by a fault: error %q (code %q)", where, e.Message, e.Code)
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
			if task.Error != nil && task.Error.Code == restartLimCode {
				continue
			}
			if exceeded {
				continue // its calls are counted all the same (reentries)
			}
			switch task.Kind {
			case turnKind:
				if task.ID != s.Turns[i] {
					add("%s: a second turn", where)
				}
			case "tool", stubbornKind:
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
			case agentKind:
				want(arbortype.StatusCompleted, fmt.Sprintf(`{"approved": %q}`, "yes-"+conv))
			case waiterKind:
				want(arbortype.StatusCompleted, `{"timed_out": true}`)
			case leafKind:
				if task.AbandonOnRestart && task.Status == arbortype.StatusCancelled && task.Error != nil && task.Error.Code == abandonedCode {
					f.abandoned++
					continue
				}
				leaves++
				want(arbortype.StatusCompleted, fmt.Sprintf(`{"leaf": %q}`, nameOf(task)))
			case "once":
				onceStatus = task.Status
				calls := callsOf[task.ID]
				switch {
				case calls > 1:
					// A re-entry: counted and listed by reentries.
				case task.Status == arbortype.StatusCompleted:
					want(arbortype.StatusCompleted, `{"once": true}`)
					if calls != 1 {
						add("%s: completed with %d calls logged", where, calls)
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
		wantKinds := map[string]int{turnKind: 1, "tool": 2, stubbornKind: 1, "group": 1, "sibling": 2, "doomed": 1,
			"nap": 1, "flaky": 1, "once": 1, leafKind: s.fans[i], agentKind: 0, waiterKind: 0}
		if s.cfg.Awaits {
			wantKinds[agentKind], wantKinds[waiterKind] = 1, 1
		}
		for kind, n := range wantKinds {
			if kinds[kind] != n && !exceeded {
				add("%s: %d tasks of kind %s, want %d", conv, kinds[kind], kind, n)
			}
		}
		if s.cfg.Awaits {
			s.checkBudget(conv, all, add)
		}
		if exceeded {
			continue
		}
		for _, task := range all {
			if task.Kind == turnKind {
				s.checkTurn(task, onceStatus, s.fans[i], leaves, add)
			}
		}
	}
	f.FailedByFault = len(faulty)

	s.countRestarts(recs, &f, add)

	s.collect(&f, add)
	s.reentries(&f, add)
	for _, q := range staleWriteQueries {
		for _, row := range s.Rows(q.sql) {
			add("%s: %s", q.what, row)
		}
	}

	var vs []string
	s.Retry("check", func(ctx context.Context) error {
		found, err := s.Engine.Check(ctx)
		vs = vs[:0]
		for _, v := range found {
			vs = append(vs, v.String())
		}
		return err
	})
	for _, v := range vs {
		add("checker: %s", v)
	}

	f.took = time.Since(s.Began)
	f.log(t)
	if len(problems) > 80 {
		problems = append(problems[:80], fmt.Sprintf("… and %d more", len(problems)-80))
	}
	// Not fatal: the scenario's own checks and figures still run and log.
	assert.Empty(t, problems, "\n%s", strings.Join(problems, "\n"))
	return f
}

// countRestarts counts the recoveries into f, and adds a problem for each
// that no fault explains (the first 20 listed). In a scenario of database
// faults alone (Config.DatabaseFaultsOnly), an abandoned_on_restart is the
// designed end of an abandon_on_restart run that the fault cut, whichever
// recovery came: counted apart, not a restart.
func (s *Scenario) countRestarts(recs []recovery, f *Figures, add func(string, ...any)) {
	for _, r := range recs {
		if s.cfg.DatabaseFaultsOnly && r.code == abandonedCode {
			f.abandonedRecoveries++
			continue
		}
		f.Restarts++
		if r.explainedBy == "" {
			f.unexplained++
			if f.unexplained <= 20 {
				add("a restart no kill, freeze, cut or lock explains: %s", r)
			}
		} else {
			f.explained++
		}
	}
	if f.unexplained > 20 {
		add("… and %d more restarts no fault explains", f.unexplained-20)
	}
}

// checkTurn compares a turn's result with its children's designed ends:
// of its fan leaves, completed ones (the others abandoned on restart); with
// awaits, its agent's approval and its waiter's timeout.
func (s *Scenario) checkTurn(turn arbortype.Task, onceStatus arbortype.Status, fan, completed int, add func(string, ...any)) {
	where := fmt.Sprintf("%s turn %d", turn.ConversationID, turn.ID)
	if turn.Status != arbortype.StatusCompleted {
		add("%s: %s, want completed (error %+v)", where, turn.Status, turn.Error)
		return
	}
	once := `{"status": "completed", "value": {"once": true}}`
	if onceStatus == arbortype.StatusCancelled {
		once = `{"status": "cancelled", "value": null}`
	}
	leaves := ""
	if fan > 0 {
		leaves = fmt.Sprintf(`, "leaves": {"status": "completed", "value": %d}`, completed)
	}
	awaits := ""
	if s.cfg.Awaits {
		awaits = fmt.Sprintf(`,
		"agent": {"status": "completed", "value": {"approved": %q}},
		"waiter": {"status": "completed", "value": {"timed_out": true}}`, "yes-"+turn.ConversationID)
	}
	want := fmt.Sprintf(`{
		"tool0": {"status": "completed", "value": {"tool": "tool0"}},
		"tool1": {"status": "completed", "value": {"tool": "tool1"}},
		"tool2": {"status": "completed", "value": {"tool": "tool2"}},
		"group": {"status": "completed", "value": {"doomed": "failed", "siblings": ["aborted", "aborted"]}},
		"nap":   {"status": "completed", "value": {"slept": true}},
		"flaky": {"status": "completed", "value": {"retries": 1}},
		"once":  %s%s%s}`, once, leaves, awaits)
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

// callsPerTask returns how many handler calls each task had.
func (s *Scenario) callsPerTask() map[int64]int {
	out := map[int64]int{}
	s.Retry("read run_log", func(ctx context.Context) error {
		clear(out)
		rows, err := s.Pool.Query(ctx, s.Q(`SELECT task_id, count(*) FROM {s}.run_log GROUP BY task_id`))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var task int64
			var n int
			if err := rows.Scan(&task, &n); err != nil {
				return err
			}
			out[task] = n
		}
		return rows.Err()
	})
	return out
}

// callsCTE: every handler call with the end of its interval — its return,
// or its process's death when it was killed first — and whether it was in
// flight while its process was frozen past the lease.
const callsCTE = `WITH calls AS (
	SELECT r.id, r.task_id, r.token, r.node, r.kind, r.stubborn, r.started_at, r.cancelled_at, r.returned_at, r.outcome,
		coalesce(r.returned_at, k.from_at, 'infinity') AS end_at,
		EXISTS (SELECT 1 FROM {s}.chaos_faults f WHERE f.kind = 'freeze_past_lease' AND f.node = r.node
			AND r.started_at < f.from_at AND coalesce(r.returned_at, k.from_at, 'infinity') > f.from_at) AS frozen
	FROM {s}.run_log r LEFT JOIN {s}.chaos_faults k ON k.kind = 'kill' AND k.node = r.node)`

// overlapPairs: every two calls of one task whose intervals from entry to
// return intersect (the later one entered before the earlier one
// returned), classed: "frozen" when the earlier call was in flight while
// its process was frozen past the lease, "stubborn" when it is of the kind
// that ignores its context and the later call ran on another node (no
// runner can stop either), "overlap" otherwise — what the runner must
// never do.
const overlapPairs = callsCTE + `, pairs AS (
	SELECT CASE WHEN x.frozen THEN 'frozen' WHEN x.stubborn AND x.node <> y.node THEN 'stubborn' ELSE 'overlap' END AS class,
		x.task_id, x.kind, x.id AS call, x.node, x.token, x.started_at, x.cancelled_at, x.end_at, x.outcome,
		y.id AS other, y.node AS other_node, y.token AS other_token, y.started_at AS other_started
	FROM calls x JOIN calls y ON x.task_id = y.task_id AND (x.started_at, x.id) < (y.started_at, y.id)
	WHERE y.started_at < x.end_at)`

const overlapSQL = overlapPairs + `
SELECT task_id, kind, call, node, token, started_at, cancelled_at, end_at, outcome, other, other_node, other_token, other_started,
	CASE WHEN node = other_node THEN 'same node' ELSE 'across nodes' END AS where_
FROM pairs WHERE class = 'overlap' ORDER BY task_id, started_at LIMIT 20`

const overlapClassesSQL = overlapPairs + ` SELECT class, count(*) FROM pairs GROUP BY class`

// effectsAfter: every side effect a call decided after another call of
// its task — a later one — had entered: the moment another run started,
// the work was no longer the first call's. checked_at is when the call
// decided it (after finding its context not cancelled, for a well-behaved
// call): a process frozen between that check and its record is not held
// to a decision it made before the freeze.
const effectsAfter = `WITH after AS (
	SELECT DISTINCT ON (e.id) e.id, e.call_id, e.task_id, e.node, e.what, e.stubborn, e.checked_at, e.at,
		y.id AS other, y.node AS other_node, y.started_at AS other_started
	FROM {s}.side_effects e JOIN {s}.run_log x ON x.id = e.call_id
	JOIN {s}.run_log y ON y.task_id = e.task_id AND (y.started_at, y.id) > (x.started_at, x.id) AND y.started_at < e.checked_at
	ORDER BY e.id, y.started_at)`

const effectsAfterSQL = effectsAfter + `
SELECT a.task_id, a.call_id, r.kind, a.node, a.what, a.checked_at, a.other, a.other_node, a.other_started, r.cancelled_at, r.cause
FROM after a JOIN {s}.run_log r ON r.id = a.call_id WHERE NOT a.stubborn ORDER BY a.task_id, a.checked_at LIMIT 20`

// landedAfterSQL counts the side effects decided before a later call of
// their task entered that reached the database after it: decided, then
// frozen or cut before being done — a figure, not a fault of the runner.
const landedAfterSQL = `SELECT count(DISTINCT e.id) FROM {s}.side_effects e JOIN {s}.run_log x ON x.id = e.call_id
	JOIN {s}.run_log y ON y.task_id = e.task_id AND (y.started_at, y.id) > (x.started_at, x.id)
		AND y.started_at >= e.checked_at AND y.started_at < e.at`

// recoveriesSQL: every restart counted — a running task's run ended by
// recovery (attempt + 1, abandoned_on_restart or restart_limit_exceeded)
// — with the node whose process started that run (by the application_name
// of the start) and the faults that explain it: a kill, freeze or cut of
// that node, or a lock of the task's conversation, whose window the run
// overlapped (started before the fault ended, recovered after it began).
// A restart with none is the runner's own: a run it gave up, or one it
// never ran, that no fault cut.
//
// It counts runs, not calls: a run claimed and cut by a kill before its
// handler logged its entry is cut all the same.
//
// A kill explains the recovery of any run its node started, even one whose
// start landed after the kill: a one-statement create that starts its task
// (docs/design.md §3.18) commits without its client, so a create sent
// before the process died can be run by the server after it — and a dead
// process sends nothing, so the start was sent before the kill (a node's
// name is never given to a second process).
const recoveriesSQL = `WITH rec AS (
	SELECT a.id, a.task_id, t.conversation_id, t.kind, a.old_token, a.at, a.new_status, coalesce(a.error_code, '') AS code,
		st.node AS run_node, st.at AS run_started
	FROM {s}.chaos_audit a JOIN {s}.tasks t ON t.id = a.task_id
	LEFT JOIN LATERAL (SELECT substr(b.app, length('{app}') + 1) AS node, b.at FROM {s}.chaos_audit b
		WHERE b.task_id = a.task_id AND b.new_token = a.old_token AND b.new_status = 'running'
		  AND b.old_status IS DISTINCT FROM 'running'
		ORDER BY b.id LIMIT 1) st ON true
	WHERE a.old_status = 'running'
	  AND (a.new_attempt > a.old_attempt OR a.error_code IN ('abandoned_on_restart', 'restart_limit_exceeded')))
SELECT r.task_id, r.conversation_id, r.kind, r.old_token, r.run_started, r.at, r.new_status, r.code, coalesce(r.run_node, ''),
	coalesce((SELECT string_agg(DISTINCT f.kind, ',') FROM {s}.chaos_faults f
		WHERE (f.node = r.run_node OR f.conversation_id = r.conversation_id
			OR (f.kind = 'restart' AND r.code = 'abandoned_on_restart'))
		  AND (r.run_started <= f.to_at OR (f.kind = 'kill' AND f.node = r.run_node)) AND r.at >= f.from_at), '')
FROM rec r ORDER BY r.at`

// recovery is a row of recoveriesSQL.
type recovery struct {
	task               int64
	conv, kind         string
	token              int64
	started, recovered time.Time
	status, code, node string
	explainedBy        string
}

func (r recovery) String() string {
	return fmt.Sprintf("task %d (%s, %s) run %d started by %s at %s, recovered (%s %s) at %s",
		r.task, r.conv, r.kind, r.token, r.node, r.started.Format("15:04:05.000"), r.status, r.code, r.recovered.Format("15:04:05.000"))
}

type taskRecoveries struct{ explained, unexplained int }

func (s *Scenario) recoveries() []recovery {
	var out []recovery
	s.Retry("read recoveries", func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.Pool.Query(ctx, s.Q(recoveriesSQL))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r recovery
			var started *time.Time
			if err := rows.Scan(&r.task, &r.conv, &r.kind, &r.token, &started, &r.recovered, &r.status, &r.code, &r.node, &r.explainedBy); err != nil {
				return err
			}
			if started != nil {
				r.started = *started
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out
}

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
		WHERE a.by_node IS NOT NULL AND a.app IS DISTINCT FROM '{app}' || a.by_node
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
		  AND (a.new_run_epoch IS DISTINCT FROM a.conv_epoch OR a.app IS DISTINCT FROM '{app}' || a.conv_holder)
		ORDER BY a.id LIMIT 20`},
	{"a settled task whose end was not written by its last run", `
		SELECT t.id AS task, t.kind, t.status, e.token AS end_token, m.token AS last_run_token
		FROM {s}.tasks t
		CROSS JOIN LATERAL (SELECT CASE t.status
			WHEN 'completed' THEN (t.result->'by'->>'token')::bigint
			WHEN 'failed' THEN substring(t.error->>'message' from '\(token ([0-9]+)\)$')::bigint END AS token) e
		CROSS JOIN LATERAL (SELECT max(r.token) AS token FROM {s}.run_log r WHERE r.task_id = t.id) m
		WHERE t.status IN ('completed', 'failed') AND e.token IS DISTINCT FROM m.token
		  AND t.error->>'code' IS DISTINCT FROM '` + restartLimCode + `'
		ORDER BY t.id LIMIT 20`},
}

// neverReturnedSQL: calls with no return whose process was not killed.
const neverReturnedSQL = `SELECT r.id AS call, r.task_id, r.kind, r.node, r.started_at FROM {s}.run_log r
	WHERE r.returned_at IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.chaos_faults k WHERE k.kind = 'kill' AND k.node = r.node)
	ORDER BY r.started_at LIMIT 20`

// outlivedSQL counts the calls that returned after their run had been
// recovered: a handler still running when its task was taken from it.
const outlivedSQL = `SELECT count(*) FROM {s}.run_log r
	WHERE r.returned_at > (SELECT min(a.at) FROM {s}.chaos_audit a WHERE a.task_id = r.task_id AND a.old_token = r.token
		AND a.old_status = 'running' AND (a.new_attempt > a.old_attempt OR a.error_code IN ('abandoned_on_restart', 'restart_limit_exceeded')))`

// stopLatencySQL: how long the calls whose context was cancelled before
// they returned took to return, in seconds.
const stopLatencySQL = `SELECT count(*),
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM returned_at - cancelled_at)), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM returned_at - cancelled_at)), 0),
	coalesce(max(extract(epoch FROM returned_at - cancelled_at)), 0)
	FROM {s}.run_log WHERE cancelled_at IS NOT NULL AND returned_at IS NOT NULL`

// idleRunSQL finds the run that stayed live (its token the task's) longest
// after its last handler call returned (or its process died), or from its
// start when no call of it was logged: time in which the task was running
// for nobody. A take-over after a kill costs about a lease; much more is
// a run left behind by its runner.
const idleRunSQL = `WITH starts AS (
	SELECT a.task_id, a.new_token AS token, a.at AS born,
		(SELECT min(d.at) FROM {s}.chaos_audit d WHERE d.task_id = a.task_id AND d.old_token = a.new_token
			AND d.new_token IS DISTINCT FROM a.new_token) AS died
	FROM {s}.chaos_audit a WHERE a.new_status = 'running' AND a.old_status IS DISTINCT FROM 'running'),
idle AS (
	SELECT st.task_id, st.token, st.died - greatest(st.born, max(coalesce(r.returned_at, k.from_at, st.born))) AS idle
	FROM starts st LEFT JOIN {s}.run_log r ON r.token = st.token
	LEFT JOIN {s}.chaos_faults k ON k.kind = 'kill' AND k.node = r.node
	GROUP BY st.task_id, st.token, st.born, st.died)
SELECT round(extract(epoch FROM i.idle)::numeric, 3) || ' s' AS idle, i.task_id, t.kind, i.token FROM idle i JOIN {s}.tasks t ON t.id = i.task_id
WHERE i.idle IS NOT NULL ORDER BY i.idle DESC LIMIT 1`

// Figures are a scenario's numbers, for its log (the closing notes of
// issues 19 and 38 quote them); the scenarios check the exported ones.
type Figures struct {
	conversations, tasks, calls, runs, repeatCalls, starts, refused int
	// Overlaps counts pairs of calls by class (overlapPairs).
	Overlaps map[string]int
	// side effects, all and stubborn; decided after a later call's entry,
	// well-behaved and stubborn; decided before and landed after.
	effects, effectsStubborn, effectsAfter, effectsAfterStubborn, landedAfter int
	// FailedByFault counts the tasks failed by a fault.
	FailedByFault int
	// Restarts counts the recoveries counted (explained and unexplained:
	// recoveriesSQL), Attempts the sum of every task's attempt.
	Restarts, Attempts                int
	explained, unexplained, abandoned int
	// abandonedRecoveries counts the recoveries that settled an
	// abandon_on_restart run abandoned and that a scenario of database
	// faults alone (Config.DatabaseFaultsOnly) counts apart from Restarts.
	abandonedRecoveries       int
	giveUps                   map[string]int
	giveUpConvs               int
	warns                     map[string]int
	cancelled                 int
	stopP50, stopP99, stopMax time.Duration
	causes                    []string
	// Cut counts the calls cut by a kill (never returned).
	Cut      int
	outlived int
	idleRun  []string
	took     time.Duration

	// reentries counts the calls of abandon_on_restart tasks after their
	// first, in reentered tasks, of AORTasks; reentryKinds describes them
	// by kind (reentrySQL).
	reentered, reentries, AORTasks int
	reentryKinds                   []string
}

// collect reads the figures the run log, the side effects and the audit
// hold, and adds the problems of overlaps, side effects and calls that
// never returned.
func (s *Scenario) collect(f *Figures, add func(string, ...any)) {
	f.calls = s.Count(`SELECT count(*) FROM {s}.run_log`)
	f.runs = s.Count(`SELECT count(DISTINCT token) FROM {s}.run_log`)
	f.repeatCalls = s.Count(`SELECT count(*) FROM (SELECT token FROM {s}.run_log GROUP BY token HAVING count(*) > 1) x`)
	f.refused = s.Count(`SELECT coalesce(sum(refused), 0) FROM {s}.run_log`)
	f.starts = s.Count(`SELECT count(*) FROM {s}.chaos_audit WHERE new_status = 'running' AND old_status IS DISTINCT FROM 'running'`)
	f.Cut = s.Count(`SELECT count(*) FROM {s}.run_log r JOIN {s}.chaos_faults k ON k.kind = 'kill' AND k.node = r.node WHERE r.returned_at IS NULL`)
	f.outlived = s.Count(outlivedSQL)
	f.idleRun = s.Rows(idleRunSQL)
	if stamped := s.Count(`SELECT count(*) FROM {s}.chaos_audit WHERE by_token IS NOT NULL`); stamped == 0 || f.starts == 0 {
		add("the audit recorded %d stamped writes and %d starts: the proof would be empty", stamped, f.starts)
	}

	f.Overlaps = map[string]int{}
	s.Retry("overlap classes", func(ctx context.Context) error {
		clear(f.Overlaps)
		rows, err := s.Pool.Query(ctx, s.Q(overlapClassesSQL))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var class string
			var n int
			if err := rows.Scan(&class, &n); err != nil {
				return err
			}
			f.Overlaps[class] = n
		}
		return rows.Err()
	})
	for _, row := range s.Rows(overlapSQL) {
		add("two calls of a task at once: %s", row)
	}

	f.effects = s.Count(`SELECT count(*) FROM {s}.side_effects`)
	f.effectsStubborn = s.Count(`SELECT count(*) FROM {s}.side_effects WHERE stubborn`)
	f.effectsAfter = s.Count(effectsAfter + ` SELECT count(*) FROM after WHERE NOT stubborn`)
	f.effectsAfterStubborn = s.Count(effectsAfter + ` SELECT count(*) FROM after WHERE stubborn`)
	f.landedAfter = s.Count(landedAfterSQL)
	for _, row := range s.Rows(effectsAfterSQL) {
		add("a side effect after another call of its task started: %s", row)
	}
	if f.effects == 0 {
		add("no side effect was recorded: the proof would be empty")
	}
	for _, row := range s.Rows(neverReturnedSQL) {
		add("a handler call that never returned (its process was not killed): %s", row)
	}

	var n int
	var p50, p99, pmax float64
	s.Retry("stop latency", func(ctx context.Context) error {
		return s.Pool.QueryRow(ctx, s.Q(stopLatencySQL)).Scan(&n, &p50, &p99, &pmax)
	})
	f.cancelled = n
	f.stopP50, f.stopP99, f.stopMax = seconds(p50), seconds(p99), seconds(pmax)
	f.causes = s.Rows(`SELECT cause, count(*) AS calls FROM {s}.run_log WHERE cancelled_at IS NOT NULL GROUP BY cause ORDER BY 2 DESC`)
	f.warns, f.giveUps, f.giveUpConvs = s.logSummary()
}

func seconds(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// ms formats a duration in milliseconds, for the figures.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func (f Figures) log(t interface{ Logf(string, ...any) }) {
	t.Logf("figures: %d conversations, %d tasks; %d handler calls of %d runs (%d runs called more than once), %d starts, %d writes refused",
		f.conversations, f.tasks, f.calls, f.runs, f.repeatCalls, f.starts, f.refused)
	t.Logf("figures: overlapping handler calls: %d (exempt: %d of calls in flight while frozen past the lease; counted apart: %d of the stubborn kind across nodes)",
		f.Overlaps["overlap"], f.Overlaps["frozen"], f.Overlaps["stubborn"])
	t.Logf("figures: side effects after another call of their task started: %d (stubborn, counted apart: %d); of %d side effects (%d stubborn); %d decided before a later call's entry landed after it",
		f.effectsAfter, f.effectsAfterStubborn, f.effects, f.effectsStubborn, f.landedAfter)
	t.Logf("figures: tasks failed by a fault: %d; restarts counted: %d (%d explained by a kill, freeze, cut or lock, %d unexplained; sum of attempts %d, %d abandon_on_restart tasks abandoned, %d of them by a recovery counted apart, as a failover's)",
		f.FailedByFault, f.Restarts, f.explained, f.unexplained, f.Attempts, f.abandoned, f.abandonedRecoveries)
	t.Logf("figures: re-entries of abandon_on_restart handlers: %d calls after the first, of %d tasks (of %d abandon_on_restart tasks) [%s]",
		f.reentries, f.reentered, f.AORTasks, strings.Join(f.reentryKinds, "; "))
	var gs []string
	for _, msg := range slices.Sorted(maps.Keys(f.giveUps)) {
		gs = append(gs, fmt.Sprintf("%d × %q", f.giveUps[msg], msg))
	}
	t.Logf("figures: give-ups: %d log lines naming %d conversations [%s]", sum(f.giveUps), f.giveUpConvs, strings.Join(gs, "; "))
	t.Logf("figures: handler stop latency after cancel: %d calls cancelled before returning, p50 %s, p99 %s, max %s; causes: %s",
		f.cancelled, ms(f.stopP50), ms(f.stopP99), ms(f.stopMax), strings.Join(f.causes, "; "))
	t.Logf("figures: %d calls cut by a kill; %d calls returned after their run was recovered; longest a run stayed live with no call of it going on: %s",
		f.Cut, f.outlived, strings.Join(f.idleRun, ""))
	for _, msg := range slices.Sorted(maps.Keys(f.warns)) {
		t.Logf("runner log: %5d × %s", f.warns[msg], msg)
	}
	t.Logf("figures: took %s", f.took.Round(100*time.Millisecond))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// checkBudget compares a conversation's budget with what its agent did:
// nothing left reserved, and spent what the agent's runs recorded
// (recordFor each), plus reserveFor for each reservation of a run that was
// over before it recorded (spent in full, once), nothing for a run cut
// before it reserved: nothing lost, nothing counted twice.
func (s *Scenario) checkBudget(conv string, all []arbortype.Task, add func(string, ...any)) {
	var bs arbortype.ConversationBudgets
	s.Retry("budgets "+conv, func(ctx context.Context) error {
		var err error
		bs, err = s.Engine.Budgets(ctx, conv)
		return err
	})
	var b *arbortype.Budget
	for i := range bs.Budgets {
		if bs.Budgets[i].TaskID == 0 && bs.Budgets[i].Counter == tokenCounter {
			b = &bs.Budgets[i]
		}
	}
	if b == nil {
		add("%s: no conversation budget of %s", conv, tokenCounter)
		return
	}
	// The agent's calls: its runs before the await (each reserved, and
	// recorded unless it was cut first), and the one after it.
	before := -1
	for _, task := range all {
		if task.Kind == agentKind {
			before = s.Count(`SELECT count(*) FROM {s}.run_log WHERE task_id = $1`, task.ID) - 1
		}
	}
	// A run cut before its reservation spent nothing; the last run before
	// the await recorded.
	fits := false
	for recorded := 1; recorded <= before; recorded++ {
		for unrecorded := 0; recorded+unrecorded <= before; unrecorded++ {
			fits = fits || b.Spent == int64(recorded*recordFor+unrecorded*reserveFor)
		}
	}
	switch {
	case b.Reserved != 0:
		add("%s: %d %s still reserved", conv, b.Reserved, tokenCounter)
	case !fits:
		add("%s: spent %d %s, which is not %d for each of the agent's %d runs before its await that recorded, %d for each that reserved and did not, 0 for each that did not reserve",
			conv, b.Spent, tokenCounter, recordFor, before, reserveFor)
	}
}
