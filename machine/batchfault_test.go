package machine_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// stallOnce installs a trigger that makes the first update of a task to
// status `to` sleep for d inside its statement: the transaction that makes
// it (a completer's flush for "completed", a claim for "running") is then
// caught in flight. It returns a function reporting the pid of the backend
// asleep in it (0 when none is).
func stallOnce(t *testing.T, b *bundle, to string, d time.Duration) func() int {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`
		CREATE SEQUENCE %[1]s.stall_once;
		CREATE FUNCTION %[1]s.stall() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = '%[2]s' AND OLD.status <> NEW.status THEN
				IF nextval('%[1]s.stall_once') = 1 THEN
					PERFORM pg_sleep(%[3]f);
				END IF;
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER stall BEFORE UPDATE ON %[1]s.tasks FOR EACH ROW EXECUTE FUNCTION %[1]s.stall();`,
		b.schema, to, d.Seconds()))
	require.NoError(t, err)
	return func() int {
		var pid int
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE wait_event = 'PgSleep' AND query LIKE '%' || $1 || '%'`, b.schema).Scan(&pid)
		require.NoError(t, err)
		return pid
	}
}

// TestFaultsDuringBatchedWrites: a runner process is caught in the middle
// of a completer's flush (a batch of completes in flight) or of a node
// claim (the update that starts tasks in flight), and then either killed
// (SIGKILL: its transaction never commits; another runner takes its
// conversations over once the leases expire) or cut off (its backend
// terminated: the runner retries the transaction). Nothing is lost, no task
// is run by two runs at once, the checker finds nothing; a runner cut off
// from its backend applies every outcome once, with no task recovered.
func TestFaultsDuringBatchedWrites(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		to   string // the status whose update is caught in flight
		kill bool
	}{
		{"SIGKILL during a flush", "completed", true},
		{"SIGKILL during a claim", "running", true},
		{"termination during a flush", "completed", false},
		{"termination during a claim", "running", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			createRunLog(t, b)
			stalled := stallOnce(t, b, tc.to, 2*time.Second)
			const conversations = 20
			in, _ := json.Marshal(workInput{Steps: 3, StepMS: 10})
			for i := range conversations {
				_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%02d", b.conv, i), Kind: "root", Input: in})
				require.NoError(t, err)
			}
			a := startChild(t, b, "node-a")
			var pid int
			waitUntil(t, "a batched write to be caught in flight", func() bool { pid = stalled(); return pid != 0 })
			var killedAt time.Time
			if tc.kill {
				a.kill()
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&killedAt))
				startChild(t, b, "node-b")
			} else {
				var ok bool
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
				require.True(t, ok)
			}
			waitUntil(t, "every task to settle", func() bool { return b.liveTasks(t) == 0 })

			all, err := b.engine.ConversationTasks(b.ctx, fmt.Sprintf("%s-%02d", b.conv, 0))
			require.NoError(t, err)
			require.NotEmpty(t, all)
			require.Equal(t, conversations*4, b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE status = 'completed'`),
				"every root and step completed")
			if tc.kill {
				// The killed process's runs ended with it, at the latest
				// when it was reaped: also one whose row a statement it had
				// sent inserted after that (its backend ran the statement
				// before it noticed the client was gone).
				_, err := b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.run_log SET live_until = coalesce(live_until, $1), returned_at = $1
					WHERE node = 'node-a' AND returned_at IS NULL`, killedAt)
				require.NoError(t, err)
			}
			requireNoOverlap(t, b)
			if !tc.kill {
				require.Zero(t, b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE attempt > 0`), "nothing was recovered: the transaction ran again")
				requireEachStepCompletedOnce(t, b, conversations*3)
			} else {
				// The killed node's runs that did not land are recovered and
				// run again; each step's last run completed it.
				require.GreaterOrEqual(t, b.count(t, `SELECT count(*) FROM `+b.schema+`.run_log`), conversations*3)
				require.Zero(t, b.count(t, `SELECT count(*) FROM `+b.schema+`.tasks WHERE kind = 'step' AND status <> $1`, string(arbortype.StatusCompleted)))
			}
			vs, err := b.engine.Check(b.ctx)
			require.NoError(t, err)
			require.Empty(t, vs)
		})
	}
}
