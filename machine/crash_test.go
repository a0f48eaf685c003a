package machine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// child is a runner in a process of its own: this test binary re-executed.
type child struct {
	cmd  *exec.Cmd
	node string
}

func startChild(t *testing.T, b *bundle, node string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ARBOR_CHILD_RUNNER=1", "ARBOR_CHILD_SCHEMA="+b.schema, "ARBOR_CHILD_NODE="+node)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, node: node}
	t.Cleanup(func() { c.kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "child runner %s did not start", node)
	require.True(t, strings.HasPrefix(line, "runner started"), line)
	go func() { _, _ = bufio.NewReader(out).WriteTo(devNull{}) }()
	return c
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
}

// stop asks the child to shut down gracefully and waits for it.
func (c *child) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, c.cmd.Wait(), "child %s exits cleanly", c.node)
}

func createRunLog(t *testing.T, b *bundle) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, fmt.Sprintf(runLogDDL, b.schema))
	require.NoError(t, err)
}

// overlappingRuns selects the pairs of runs of one task that overlapped
// (x the earlier): on two nodes, their live spans — from the handler's
// entry to the last moment it found its context live — intersect; on one
// node, their handlers did, from entry to return. That is the guarantee
// (docs/design.md §3.8, docs/guarantees.md "When a handler is stopped"): a
// runner cancels its handlers' contexts before another node may take its
// conversations, and on one node a task's next run waits for its previous
// handler to return. A handler that is slow to return after its context
// was cancelled (as the work handlers are under load, writing the run log
// on a busy pool) is its own business across nodes: arbor cannot stop it.
const overlappingRuns = `SELECT x.task_id, x.token, x.node, x.kind, x.started_at, x.live_until, x.returned_at,
		y.token, y.node, y.started_at, y.live_until, y.returned_at
	FROM {s}.run_log x JOIN {s}.run_log y ON x.task_id = y.task_id AND x.id < y.id
	WHERE (x.started_at < coalesce(y.live_until, 'infinity') AND y.started_at < coalesce(x.live_until, 'infinity'))
	   OR (x.node = y.node AND x.started_at < coalesce(y.returned_at, 'infinity') AND y.started_at < coalesce(x.returned_at, 'infinity'))`

// requireNoOverlap fails the test, listing them, if two runs of a task
// overlapped (overlappingRuns).
func requireNoOverlap(t *testing.T, b *bundle) {
	t.Helper()
	q := strings.ReplaceAll(overlappingRuns, "{s}", b.schema)
	if n := b.count(t, `SELECT count(*) FROM (`+q+`) o`); n > 0 {
		logRows(t, b, q)
		t.Fatalf("%d pairs of runs of one task overlapped", n)
	}
}

// requireEachStepCompletedOnce fails the test unless each of the steps
// (tasks of kind step, all completed) was completed by its last run — the
// row of the run log its result names — and every other run of it lost
// its lease. On a busy machine a runner may not confirm its lease in time:
// its fence stops its handlers, and their tasks run again, on this node
// once it re-validated its conversations or on the node that took them
// over (docs/design.md §3.8: one run at a time, not one run). A run that
// ended any other way and was run again would be a task run twice, and a
// Complete that returned nil for a run whose result did not land a result
// lost.
func requireEachStepCompletedOnce(t *testing.T, b *bundle, steps int) {
	t.Helper()
	s := b.schema
	unexplained := `SELECT r.task_id, r.id, r.node, r.token, r.attempt, r.started_at, r.live_until, r.returned_at, r.outcome
		FROM ` + s + `.run_log r JOIN ` + s + `.tasks t ON t.id = r.task_id
		WHERE r.id IS DISTINCT FROM (t.result->>'run')::bigint AND r.lease_lost IS NOT TRUE`
	if n := b.count(t, `SELECT count(*) FROM (`+unexplained+`) u`); n > 0 {
		logRows(t, b, unexplained+` ORDER BY r.task_id, r.id`)
		t.Fatalf("%d runs did not complete their task, yet did not lose their lease", n)
	}
	require.Equal(t, steps, b.count(t, `SELECT count(*) FROM `+s+`.tasks t WHERE t.kind = 'step' AND EXISTS (
		SELECT 1 FROM `+s+`.run_log r WHERE r.task_id = t.id AND r.id = (t.result->>'run')::bigint AND r.node = t.result->>'by'
		  AND NOT EXISTS (SELECT 1 FROM `+s+`.run_log l WHERE l.task_id = r.task_id AND l.id > r.id))`),
		"each step was completed by its last run, which its result names")
	t.Logf("runs cut by a lost lease and run again: %d", b.count(t, `SELECT count(*) FROM `+s+`.run_log r JOIN `+s+`.tasks t ON t.id = r.task_id
		WHERE r.id <> (t.result->>'run')::bigint`))
}

// logRows logs the rows query returns.
func logRows(t *testing.T, b *bundle, query string) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, query)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		v, _ := rows.Values()
		t.Log(v...)
	}
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, query, args...).Scan(&n))
	return n
}

func (b *bundle) liveTasks(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE status IN ('pending','running','waiting','sleeping','completing')`)
}

// TestCrashRecovery kills a runner process with SIGKILL in the middle of
// its trees; a new runner of the same host takes over at once, proving the
// death by the killed process's life lock (its lease, ten seconds, so
// that a starved CPU does not lapse it before the kill: a lapse would
// requeue its own runs, and the figures below count runs of one life
// only; without the proof the lease is waited for). Every task
// settles, attempts grew where runs were cut, abandon_on_restart tasks were
// cancelled and never re-run, restart limits held, and the invariant
// checker finds nothing.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createRunLog(t, b)
	var convs []string
	for i := range 3 {
		conv := fmt.Sprintf("%s-%d", b.conv, i)
		convs = append(convs, conv)
		// Steps outlast the once and slow tasks (two seconds), so that
		// some still run when the last of those has started, however
		// starved the child is.
		in, _ := json.Marshal(workInput{Steps: 4, StepMS: 4000, Once: true, Slow: true})
		_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "root", Input: in})
		require.NoError(t, err)
	}
	a := startChild(t, b, "node-a", "ARBOR_CHILD_LEASE=10s")
	// Kill it once every once and slow task and some steps are running.
	waitUntil(t, "work to be under way in the child", func() bool {
		return b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE kind IN ('once', 'slow')`) == 6 &&
			b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE status = 'running' AND kind = 'step'`) >= 3
	})
	a.kill()
	killedAt := time.Now()
	runningAtKill := b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE status = 'running'`)
	require.Positive(t, runningAtKill)

	var reports []string
	pool := b.pool
	// node-b's lease is as long, so that a starved CPU does not lapse it
	// either.
	cfgB := childRunnerConfig("node-b")
	cfgB.ConversationLease = 10 * time.Second
	r, err := machine.NewRunner(b.engine.Engine, workHandlers(pool, b.schema, "node-b"), cfgB)
	require.NoError(t, err)
	_ = reports
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	waitUntil(t, "every task to settle", func() bool { return b.liveTasks(t) == 0 })
	t.Logf("recovered and finished %s after the kill (lease 10 s)", time.Since(killedAt).Round(time.Millisecond))

	for _, conv := range convs {
		all, err := b.engine.ConversationTasks(b.ctx, conv)
		require.NoError(t, err)
		for _, task := range all {
			runs := b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE task_id = $1`, task.ID)
			switch task.Kind {
			case "root":
				require.Equal(t, arbortype.StatusCompleted, task.Status, "the turn finished")
			case "once":
				require.Equal(t, arbortype.StatusCancelled, task.Status)
				require.Equal(t, arbortype.CodeAbandonedOnRestart, task.Error.Code)
				require.Equal(t, 1, runs, "an abandon_on_restart task never runs twice")
			case "slow":
				require.Equal(t, arbortype.StatusFailed, task.Status)
				require.Equal(t, arbortype.CodeRestartLimitExceeded, task.Error.Code)
				require.Equal(t, 1, runs, "restart limit 0: no second run")
			case "step":
				require.Equal(t, arbortype.StatusCompleted, task.Status)
				// Attempt counts the runs the crash cut — node-a's whose
				// handler never returned and whose Complete did not land,
				// its work done or not — and a run node-b lost with its
				// own lease, if a starved CPU let it lapse (a lapse counts
				// as a restart, §3.8).
				cut := b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log r WHERE r.task_id = $1 AND r.node = 'node-a' AND r.returned_at IS NULL
					AND r.id IS DISTINCT FROM (SELECT (t.result->>'run')::bigint FROM `+b.schema+`.tasks t WHERE t.id = r.task_id)`, task.ID)
				lost := b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE task_id = $1 AND node = 'node-b' AND lease_lost`, task.ID)
				// A run node-a had started when the kill came, before
				// its handler logged it, shows as the first logged run's
				// attempt (node-b's, after the take-over).
				unlogged := b.count(t, `SELECT coalesce((SELECT attempt FROM `+b.schema+`.run_log WHERE task_id = $1 ORDER BY id LIMIT 1), 0)`, task.ID)
				if task.Attempt < cut || task.Attempt > cut+lost+unlogged {
					logRows(t, b, `SELECT * FROM `+b.schema+`.run_log WHERE task_id = `+strconv.FormatInt(task.ID, 10)+` ORDER BY id`)
					t.Fatalf("task %d: attempt %d, yet the crash cut %d of its logged runs (and %d unlogged) and node-b lost its lease in %d", task.ID, task.Attempt, cut, unlogged, lost)
				}
			}
		}
		vs, err := b.engine.Check(b.ctx, conv)
		require.NoError(t, err)
		require.Empty(t, vs)
	}
	require.Positive(t, b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE kind = 'step' AND attempt = 1`), "some steps were recovered")
}

// TestKilledRunnerRestartedTakesOverAtOnce (issue 41): a runner process
// killed with SIGKILL and started again on the same host runs its
// conversations again without waiting for its lease (a minute here, never
// waited for): the new process gets the lock of the dead life's file,
// proving the death, and ends its holder row (ended_by names the new
// life). The cut run is recovered as a restart, and runs again only after
// the killed process is gone. The time from the kill to the new handler's entry is logged.
func TestKilledRunnerRestartedTakesOverAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createRunLog(t, b)
	env := []string{"ARBOR_CHILD_LEASE=1m", "ARBOR_CHILD_LIFEDIR=" + t.TempDir()}
	in, _ := json.Marshal(workInput{Steps: 1, StepMS: 60_000})
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "root", Input: in})
	require.NoError(t, err)
	a := startChild(t, b, "node-a", env...)
	waitUntil(t, "the step to run in node-a", func() bool {
		return b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE kind = 'step' AND node = 'node-a'`) == 1
	})
	var deadLife int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT holder_id FROM `+b.schema+`.conversations WHERE id = $1`, b.conv).Scan(&deadLife))
	a.kill()
	killed := time.Now()
	c := startChild(t, b, "node-a-again", env...) // restarted on the same host
	waitUntil(t, "the step to run again after the restart", func() bool {
		return b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE kind = 'step'`) == 2
	})
	var entered time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT max(started_at) FROM `+b.schema+`.run_log WHERE kind = 'step'`).Scan(&entered))
	t.Logf("same-host SIGKILL and restart: the cut run entered again %s after the kill (lease 1 min)", entered.Sub(killed).Round(time.Millisecond))

	var endedBy *int64
	var holder int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ended_by FROM `+b.schema+`.holders WHERE id = $1`, deadLife).Scan(&endedBy))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT holder_id FROM `+b.schema+`.conversations WHERE id = $1`, b.conv).Scan(&holder))
	require.NotNil(t, endedBy, "the dead life was ended by a proof, not by its lease")
	require.Equal(t, holder, *endedBy, "by the new life, which holds the conversation now")
	var attempt int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT attempt FROM `+b.schema+`.tasks WHERE kind = 'step'`).Scan(&attempt))
	require.Equal(t, 1, attempt, "the cut run counts as a restart")
	require.True(t, entered.After(killed), "the new run entered after the killed process was gone (its Wait returned)")
	c.stop(t)
}

// TestRunnersNeverOverlap runs two, then three, runner processes over a few
// hundred conversations. Every handler run records (task, token, runner)
// with its start, its end and how it ended; no task is ever run by two
// runs at once, each step is completed by one run, and every other run of
// it lost its lease (on a busy machine, fences fire). The run log's
// per-node counts say how the work was shared.
func TestRunnersNeverOverlap(t *testing.T) {
	t.Parallel()
	for _, nodes := range [][]string{{"node-a", "node-c"}, {"node-a", "node-b", "node-c"}} {
		t.Run(fmt.Sprint(len(nodes)), func(t *testing.T) {
			t.Parallel()
			runnersNeverOverlap(t, nodes)
		})
	}
}

func runnersNeverOverlap(t *testing.T, nodes []string) {
	b := setup(t)
	createRunLog(t, b)
	const conversations = 200
	in, _ := json.Marshal(workInput{Steps: 2, StepMS: 20})
	for i := range conversations {
		_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%03d", b.conv, i), Kind: "root", Input: in})
		require.NoError(t, err)
	}
	var children []*child
	for _, n := range nodes {
		children = append(children, startChild(t, b, n))
	}
	waitUntil(t, "every task to settle", func() bool { return b.liveTasks(t) == 0 })
	for _, c := range children {
		c.stop(t)
	}

	if n := b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE kind = 'step' AND status = 'completed'`); n != conversations*2 {
		rows, _ := b.pool.Query(b.ctx, `SELECT id, status, attempt, error::text, error_history::text FROM `+b.schema+`.tasks WHERE kind = 'step' AND status <> 'completed'`)
		for rows.Next() {
			v, _ := rows.Values()
			t.Log(v...)
		}
		rows.Close()
		t.Fatalf("%d steps completed of %d", n, conversations*2)
	}
	requireNoOverlap(t, b)
	perNode := map[string]int{}
	rows, err := b.pool.Query(b.ctx, `SELECT node, count(*) FROM `+b.schema+`.run_log GROUP BY node`)
	require.NoError(t, err)
	for rows.Next() {
		var node string
		var n int
		require.NoError(t, rows.Scan(&node, &n))
		perNode[node] = n
	}
	require.NoError(t, rows.Err())
	t.Logf("runs per node: %v", perNode)
	requireEachStepCompletedOnce(t, b, conversations*2)
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// TestAbortFromAnotherProcess: a runner process runs a blocking handler;
// this process aborts its task. The handler's context is cancelled, and the
// test measures how long after the abort committed (database clock).
func TestAbortFromAnotherProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createRunLog(t, b)
	startChild(t, b, "node-a")
	var latencies []time.Duration
	for i := range 5 {
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%d", b.conv, i), Kind: "block"})
		require.NoError(t, err)
		waitUntil(t, "the handler to start", func() bool {
			return b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log WHERE task_id = $1`, task.ID) == 1
		})
		_, err = b.engine.Abort(b.ctx, task.ID)
		require.NoError(t, err)
		var committed time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&committed))
		var cancelled time.Time
		waitUntil(t, "the handler's context to be cancelled", func() bool {
			err := b.pool.QueryRow(b.ctx, `SELECT cancelled_at FROM `+b.schema+`.run_log WHERE task_id = $1 AND cancelled_at IS NOT NULL`, task.ID).Scan(&cancelled)
			return err == nil
		})
		latencies = append(latencies, cancelled.Sub(committed))
		require.Equal(t, arbortype.StatusAborted, b.status(t, task.ID))
	}
	t.Logf("abort committed → handler context cancelled in the other process: %v", latencies)
}
