package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/faultharness"
)

// TestKilledWhileCreating (s): the runner processes create the work
// themselves, so that their creates start the turns (docs/design.md §3.18:
// the conversation inserted taken by the process's runner, the turn
// inserted running, the handler entered after the commit), and the kills
// land on those creates. Two runner processes at a time, each creating 20
// conversations of one turn while it runs (one by one with Create, or two
// or three at a time with CreateMany, 40 to 120 ms apart: createTurns),
// recording each create before it is sent and what it returned in
// create_log. They are killed with SIGKILL in turn six times, a new one
// started after each kill; each kill waits until the victim has handler
// calls behind it (15 to 59 more in all), then for the victim's next
// "creating" line, and lands 0 to 3 ms after it: before the statement is
// sent, while it is in flight, between its commit and the handler's entry,
// or in the handler. Before each kill, the other process's next create is
// cut if the test finds its statement running (cutCreate: its connection
// terminated, the create ErrAmbiguous to its caller). Once the last two processes have made their creates,
// the test issues every create recorded again, with its key, from its own
// engine (no runner: a conversation whose create never landed is created
// pending, and claimed by the survivors): a create that returned a task
// must give that task back (created false); one that failed must not have
// landed; one whose caller died or got ErrAmbiguous gives the turn that
// landed, or creates it. After that, the usual proof (Verify: nothing
// lost, no two calls of a task at once, no restart no kill explains, no
// stale write, the checker clean), and this scenario's: some turns really
// were started by their creates (inserted running in the audit, and, the
// same turns, those whose first entry in their conversation's log is
// `running`, not `pending`: design.md §3.14); every
// recorded create's conversation has exactly one turn, completed; and no
// conversation beyond them.
func TestKilledWhileCreating(t *testing.T) {
	const (
		perChild = 20
		kills    = 6
	)
	s := setupWith(t, 0, faultharness.Config{}, func(s *scenario) { s.Exec(createLogDDL) })
	live := []*child{s.startCreatingChild("s00", leaseDefault, perChild), s.startCreatingChild("s01", leaseDefault, perChild)}
	var landed []string
	cuts := 0
	for i := range kills {
		s.WaitProgress(s.Runs(), 15+s.rng.IntN(45))
		if s.cutCreate(live[(i+1)%2]) {
			cuts++
		}
		c := live[i%2]
		where := "after its creates"
		select {
		case <-c.out.creating:
			where = "at a create"
			time.Sleep(time.Duration(s.rng.IntN(3000)) * time.Microsecond)
		case <-c.out.createsDone:
		case <-c.done:
			require.FailNow(t, "runner process died", "%s: %v; its log:\n%s", c.node, c.err, faultharness.Tail(c.log, 40))
		}
		s.kill(c)
		landed = append(landed, c.node+" "+where)
		live[i%2] = s.startCreatingChild(fmt.Sprintf("s%02d", i+2), leaseDefault, perChild)
	}
	for _, c := range live {
		s.WaitFor("the creates of "+c.node, func() bool {
			select {
			case <-c.out.createsDone:
				return true
			case <-c.done:
				require.FailNow(t, "runner process died", "%s: %v; its log:\n%s", c.node, c.err, faultharness.Tail(c.log, 40))
			default:
			}
			return false
		})
	}
	acc := s.reissueCreates()
	s.WaitSettled()
	for _, c := range live {
		s.stop(c)
	}
	f := s.Verify()
	t.Logf("(s) %d kills: %s; %d of %d tries terminated the connection of a create found running (pg_terminate_backend; it may have answered first)", kills, strings.Join(landed, "; "), cuts, kills)
	t.Logf("(s) creates: %s", acc)
	for _, row := range acc.unfinished {
		t.Logf("(s) a create whose caller died or was not answered: %s", row)
	}

	// Started by their creates: inserted running (the audit), the same
	// turns as those whose first log entry is running, not pending
	// (design.md §3.14), and as those whose create returned them running.
	byAudit := s.Count(`SELECT count(*) FROM {s}.chaos_audit a JOIN {s}.tasks t ON t.id = a.task_id
		WHERE a.op = 'insert' AND a.new_status = 'running' AND t.kind = 'turn'`)
	require.Empty(t, s.Rows(`SELECT * FROM (SELECT t.id, t.conversation_id,
			EXISTS (SELECT 1 FROM {s}.chaos_audit a WHERE a.task_id = t.id AND a.op = 'insert' AND a.new_status = 'running') AS inserted_running,
			(SELECT l.status FROM {s}.conversation_log l WHERE l.task_id = t.id AND l.kind = 'status' ORDER BY l.seq LIMIT 1) AS first_entry
		FROM {s}.tasks t WHERE t.kind = 'turn') x
		WHERE inserted_running IS DISTINCT FROM (first_entry = 'running')
		ORDER BY id LIMIT 20`),
		"a turn inserted running is exactly one whose first log entry is running, not pending")
	require.Empty(t, s.Rows(`SELECT c.conversation_id, c.node, c.via, c.status AS returned, a.new_status AS inserted
		FROM {s}.create_log c JOIN {s}.chaos_audit a ON a.task_id = c.task_id AND a.op = 'insert'
		WHERE c.status IS NOT NULL AND c.created AND c.status IS DISTINCT FROM a.new_status ORDER BY 1 LIMIT 20`),
		"a create returned its turn running exactly when it inserted it running")
	firstRunning := s.Count(`SELECT count(*) FROM {s}.tasks t WHERE t.kind = 'turn' AND (SELECT l.status FROM {s}.conversation_log l
		WHERE l.task_id = t.id AND l.kind = 'status' ORDER BY l.seq LIMIT 1) = 'running'`)
	notEntered := s.Rows(`SELECT a.task_id, a.new_token AS token, substr(a.app, length('{app}') + 1) AS node,
			EXISTS (SELECT 1 FROM {s}.chaos_faults k WHERE k.kind = 'kill' AND k.node = substr(a.app, length('{app}') + 1)) AS killed
		FROM {s}.chaos_audit a JOIN {s}.tasks t ON t.id = a.task_id
		WHERE a.op = 'insert' AND a.new_status = 'running' AND t.kind = 'turn'
		  AND NOT EXISTS (SELECT 1 FROM {s}.run_log r WHERE r.task_id = a.task_id AND r.token = a.new_token)
		ORDER BY a.task_id`)
	t.Logf("(s) turns started by their creates: %d of %d, %.0f%% (%d creates returned a task running; %d turns whose first log entry is running, not pending); %d of them never entered by that run: %s",
		byAudit, len(s.Turns), 100*float64(byAudit)/float64(len(s.Turns)), acc.returnedRunning, firstRunning, len(notEntered), strings.Join(notEntered, "; "))
	require.Positive(t, byAudit, "some turns were started by their creates")
	require.Positive(t, acc.returnedRunning, "some creates returned their turn running")
	require.Positive(t, acc.diedInCreate, "some kills landed on a create whose caller never learnt its outcome")

	// Every recorded create: one turn, completed; none beyond them.
	require.Empty(t, s.Rows(`SELECT c.conversation_id, count(t.id) AS turns, string_agg(t.status, ',') AS statuses
		FROM {s}.create_log c LEFT JOIN {s}.tasks t ON t.conversation_id = c.conversation_id AND t.owner_task_id IS NULL
		GROUP BY c.conversation_id HAVING count(t.id) <> 1 OR bool_or(t.status IS DISTINCT FROM 'completed')
		ORDER BY 1 LIMIT 20`), "every create recorded has exactly one turn, completed")
	require.Zero(t, s.Count(`SELECT count(*) FROM {s}.tasks t
		WHERE NOT EXISTS (SELECT 1 FROM {s}.create_log c WHERE c.conversation_id = t.conversation_id)`),
		"no task outside the conversations created")
	require.Equal(t, len(s.Turns), s.Count(`SELECT count(*) FROM {s}.create_log`))
	require.Zero(t, f.Overlaps["overlap"], "no two calls of a task at once")
	require.Positive(t, f.Restarts, "some tasks were recovered")
}

// cutCreate waits for c's next create and terminates (pg_terminate_backend)
// the connection of its one-statement create (CreateRoot) if the test
// finds it running within 50 tries: the create then fails with its answer
// lost, ErrAmbiguous, and its runner adopts what may have landed — unless
// it answered between the test's read and the terminate. It reports
// whether it terminated one. The cut is no fault of the proof's: it must
// explain no restart (chaos_faults has no row of it).
func (s *scenario) cutCreate(c *child) bool {
	select {
	case <-c.out.creating:
	case <-c.out.createsDone:
		return false
	case <-c.done:
		return false
	}
	for range 50 {
		var n int
		// The terminate in the select list, not the WHERE: it runs only for
		// the rows the WHERE kept.
		err := s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active' AND pid <> pg_backend_pid()
			  AND query LIKE 'WITH h AS (%INSERT INTO % (id, tenant, holder_id, holder, epoch)%') x WHERE done`,
			appPrefix+c.node).Scan(&n)
		if err == nil && n > 0 {
			return true
		}
	}
	return false
}

// creates is what the creates of the runner processes came to.
type creates struct {
	// Of the recorded creates, by what their caller learnt: a task, and of
	// those how many running (started by their create); an error (not
	// ErrAmbiguous); ErrAmbiguous; nothing (its process died first).
	returned, returnedRunning, failed, ambiguous, diedInCreate int
	// Of the ambiguous and unanswered ones, those that had landed (found by
	// the issue again) and those the issue again created.
	landed, createdAgain int
	unfinished           []string
}

func (c creates) String() string {
	return fmt.Sprintf("%d returned a task (%d running), %d an error, %d ErrAmbiguous, %d never returned (the process died); of those %d had landed, %d were created by the second issue",
		c.returned, c.returnedRunning, c.failed, c.ambiguous, c.diedInCreate, c.landed, c.createdAgain)
}

// reissueCreates issues every create of create_log again, with its key,
// from the test's engine, checks each against what its first issue
// returned, and gives each conversation's turn to the scenario
// (AdoptTurn).
func (s *scenario) reissueCreates() creates {
	t := s.T
	t.Helper()
	type rec struct {
		conv, node, via string
		i               int
		answered        bool
		status, errMsg  string
		id              int64
		created         bool
	}
	var recs []rec
	s.Retry("create_log", func(ctx context.Context) error {
		recs = recs[:0]
		rows, err := s.Pool.Query(ctx, s.Q(`SELECT conversation_id, node, via, i, returned_at IS NOT NULL,
			coalesce(status, ''), coalesce(error, ''), coalesce(task_id, 0), coalesce(created, false)
			FROM {s}.create_log ORDER BY intended_at, conversation_id`))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r rec
			if err := rows.Scan(&r.conv, &r.node, &r.via, &r.i, &r.answered, &r.status, &r.errMsg, &r.id, &r.created); err != nil {
				return err
			}
			recs = append(recs, r)
		}
		return rows.Err()
	})
	require.NotEmpty(t, recs, "the runner processes created conversations")
	var acc creates
	for _, r := range recs {
		before := s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id = $1 AND owner_task_id IS NULL`, r.conv)
		var turn arbortype.Task
		var created bool
		s.Retry("create "+r.conv+" again", func(ctx context.Context) error {
			var err error
			turn, created, err = s.Engine.Create(ctx, faultharness.TurnCreate(r.conv, r.i))
			return err
		})
		where := fmt.Sprintf("%s (%s by %s)", r.conv, r.via, r.node)
		switch {
		case r.answered && r.errMsg == "":
			acc.returned++
			if r.status == string(arbortype.StatusRunning) {
				acc.returnedRunning++
			}
			require.False(t, created, "%s: returned task %d, and issued again created another (%d)", where, r.id, turn.ID)
			require.Equal(t, r.id, turn.ID, "%s: issued again, gives back the task its create returned", where)
		case r.answered && r.errMsg != "ambiguous":
			acc.failed++
			require.Zero(t, before, "%s: failed with %q (the server answered: nothing written), but its turn exists", where, r.errMsg)
		default:
			if r.answered {
				acc.ambiguous++
			} else {
				acc.diedInCreate++
			}
			require.Equal(t, before == 0, created, "%s: issued again, created %v, with %d turns there before", where, created, before)
			how := "had not landed, created again"
			if created {
				acc.createdAgain++
			} else {
				acc.landed++
				how = fmt.Sprintf("had landed: %s", strings.Join(s.Rows(`SELECT a.new_status AS inserted, a.new_token AS token, a.app,
					(SELECT count(*) FROM {s}.run_log r WHERE r.task_id = a.task_id AND r.token = a.new_token) AS calls_of_that_run
					FROM {s}.chaos_audit a WHERE a.task_id = $1 AND a.op = 'insert'`, turn.ID), ", "))
			}
			ans := "no answer (killed)"
			if r.answered {
				ans = "ErrAmbiguous"
			}
			acc.unfinished = append(acc.unfinished, fmt.Sprintf("%s: %s; task %d %s", where, ans, turn.ID, how))
		}
		s.AdoptTurn(r.conv, turn.ID)
	}
	return acc
}
