package machine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// eventually is the bound on waiting for something that must happen; it is
// a deadline for a broken test, not a measurement: River alone may take a
// scheduler interval (~5 s) and a fetch poll to run a job.
const eventually = 45 * time.Second

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	engine *enginetest.Engine
	conv   string
}

// setup gives a test a schema of its own (its River clients and
// notifications must not reach other tests) and checks invariant 5 at its
// end.
func setup(t testing.TB) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	b := &bundle{ctx: context.Background(), pool: pool, schema: schema,
		engine: enginetest.New(t, pool, &tasks.Config{Schema: schema}), conv: testdb.Conversation(t)}
	t.Cleanup(func() { require.Empty(t, b.engine.SleepViolations(t, context.Background(), b.conv)) })
	return b
}

// recorder collects a waker's wake events.
type recorder struct {
	mu     sync.Mutex
	events []machine.Wake
	ch     chan machine.Wake
}

func (r *recorder) record(ev machine.Wake) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.ch <- ev:
	default:
	}
}

func (r *recorder) all() []machine.Wake {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]machine.Wake(nil), r.events...)
}

func (r *recorder) of(taskID int64) []machine.Wake {
	var out []machine.Wake
	for _, ev := range r.all() {
		if ev.TaskID == taskID {
			out = append(out, ev)
		}
	}
	return out
}

// startWaker starts a waker with River's test-friendly settings; it is
// stopped when the test ends if the test did not stop it.
func (b *bundle) startWaker(t testing.TB, timers bool) (*machine.Waker, *recorder) {
	t.Helper()
	rec := &recorder{ch: make(chan machine.Wake, 4096)}
	w, err := machine.NewWaker(b.engine.Engine, &machine.WakerConfig{
		DisableTimers: !timers,
		PollInterval:  500 * time.Millisecond,
		Horizon:       20 * time.Second,
		OnWake:        rec.record,
		RiverTestOnly: true,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(b.ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	return w, rec
}

// sleeper creates a task, starts it and puts it to sleep until wakeAt.
func (b *bundle) sleeper(t testing.TB, ownerID int64, wakeAt time.Time) arbortype.Task {
	t.Helper()
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: ownerID, Kind: "sleeper"})
	require.NoError(t, err)
	task, err = b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	task, err = b.engine.SleepUntil(b.ctx, task.ID, task.Token, wakeAt, "asleep", nil)
	require.NoError(t, err)
	return task
}

func (b *bundle) status(t testing.TB, id int64) arbortype.Status {
	t.Helper()
	task, err := b.engine.Get(b.ctx, id)
	require.NoError(t, err)
	return task.Status
}

func (b *bundle) waitStatus(t testing.TB, id int64, want arbortype.Status) {
	t.Helper()
	require.Eventually(t, func() bool { return b.status(t, id) == want }, eventually, 10*time.Millisecond,
		"task %d never became %s", id, want)
}

// jobStates returns the states of a task's wake jobs, oldest first.
func (b *bundle) jobStates(t testing.TB, taskID int64) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT state::text FROM `+pgx.Identifier{b.schema, "river_job"}.Sanitize()+
		` WHERE kind = 'arbor_wake' AND (args->>'task_id')::bigint = $1 ORDER BY id`, taskID)
	require.NoError(t, err)
	states, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return states
}

func TestRiverAloneWakesASleep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, rec := b.startWaker(t, false)
	task := b.sleeper(t, 0, time.Now().Add(300*time.Millisecond))

	b.waitStatus(t, task.ID, arbortype.StatusPending)
	require.Eventually(t, func() bool { return len(rec.of(task.ID)) == 1 }, eventually, 10*time.Millisecond)
	require.Equal(t, machine.WokenByRiver, rec.of(task.ID)[0].By)
	require.Equal(t, task.SleepSeq, rec.of(task.ID)[0].SleepSeq)
	require.Equal(t, []string{"completed"}, b.jobStates(t, task.ID), "the wake and its job's completion commit together")
}

func TestWakeAfterTheWakerIsReplaced(t *testing.T) {
	t.Parallel()
	for name, timers := range map[string]bool{"timers": true, "river alone": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			first, firstRec := b.startWaker(t, timers)
			task := b.sleeper(t, 0, time.Now().Add(1500*time.Millisecond))
			require.NoError(t, first.Stop(b.ctx), "the process that saw the sleep goes away")

			_, secondRec := b.startWaker(t, timers)
			b.waitStatus(t, task.ID, arbortype.StatusPending)
			require.Eventually(t, func() bool { return len(secondRec.of(task.ID)) == 1 }, eventually, 10*time.Millisecond)
			require.Empty(t, firstRec.all(), "the stopped waker woke nothing")
			want := machine.WokenByRiver
			if timers {
				want = machine.WokenByTimer
			}
			require.Equal(t, want, secondRec.of(task.ID)[0].By)
		})
	}
}

// TestTimerAndRiverRaceWakeOnce holds the conversation's row lock until
// both the timer's and River's wakes of one sleep are blocked on it, then
// lets them go: exactly one wakes the task.
func TestTimerAndRiverRaceWakeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, rec := b.startWaker(t, true)
	task := b.sleeper(t, 0, time.Now().Add(time.Second))

	hold, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(b.ctx) }()
	_, err = hold.Exec(b.ctx, `SELECT 1 FROM `+pgx.Identifier{b.schema, "conversations"}.Sanitize()+` WHERE id = $1 FOR UPDATE`, b.conv)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		var blocked int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%conversations%'`, b.schema).Scan(&blocked))
		return blocked >= 2
	}, eventually, 10*time.Millisecond, "the timer's and River's wakes both wait for the conversation")
	require.Equal(t, arbortype.StatusSleeping, b.status(t, task.ID))
	require.NoError(t, hold.Rollback(b.ctx))

	b.waitStatus(t, task.ID, arbortype.StatusPending)
	require.Eventually(t, func() bool {
		states := b.jobStates(t, task.ID)
		return len(states) == 0 || states[0] == "completed"
	}, eventually, 10*time.Millisecond, "River's job ends (completed, or removed by the timer's wake)")
	require.NoError(t, w.Stop(b.ctx), "wait for every wake in flight")
	require.Len(t, rec.of(task.ID), 1, "one wake for two deliveries")
}

// TestManyDeliveriesWakeOnce races a timer, River and extra callers of the
// wake path on many sleeps that are already due.
func TestManyDeliveriesWakeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, rec := b.startWaker(t, true)
	const sleeps, extra = 20, 4
	var (
		ids  []int64
		mu   sync.Mutex
		wins = map[int64]int{}
		wg   sync.WaitGroup
	)
	for range sleeps {
		task := b.sleeper(t, 0, time.Now().Add(-time.Millisecond))
		ids = append(ids, task.ID)
		for range extra {
			wg.Add(1)
			go func() {
				defer wg.Done()
				woken, err := b.engine.WakeSleeping(b.ctx, task.ID, task.SleepSeq)
				if err != nil {
					t.Errorf("wake %d: %v", task.ID, err)
				}
				if woken {
					mu.Lock()
					wins[task.ID]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, id := range ids {
		b.waitStatus(t, id, arbortype.StatusPending)
	}
	// Let every delivery in flight finish before counting.
	require.Eventually(t, func() bool {
		for _, id := range ids {
			for _, s := range b.jobStates(t, id) {
				if s != "completed" {
					return false
				}
			}
		}
		return true
	}, eventually, 10*time.Millisecond)
	require.NoError(t, w.Stop(b.ctx), "wait for every wake in flight")
	for _, id := range ids {
		mu.Lock()
		n := wins[id]
		mu.Unlock()
		require.Equal(t, 1, n+len(rec.of(id)), "task %d woken exactly once", id)
	}
}

func TestLeavingASleepCausesNoWake(t *testing.T) {
	t.Parallel()
	for name, timers := range map[string]bool{"timers": true, "river alone": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// The sleeps must be left before they are due, or the round
			// says nothing: a round whose set-up outlasted its margin (a
			// busy machine) is run again, on a fresh schema, with twice it.
			for margin := 800 * time.Millisecond; ; margin *= 2 {
				if leaveSleeps(t, timers, margin) {
					return
				}
				require.Less(t, margin, 30*time.Second, "every round's set-up outlasted its margin")
				t.Logf("the set-up outlasted its %s margin; again with %s", margin, 2*margin)
			}
		})
	}
}

// leaveSleeps puts tasks to sleep until margin from now, takes four of them
// out of their sleep (cancel, abort, abort of the owner, wake now) and
// checks that none of them is woken when its sleep was due, only the
// sentinel that stayed asleep. It reports false, having checked nothing,
// when the sleeps were due before they were all left.
func leaveSleeps(t *testing.T, timers bool, margin time.Duration) bool {
	b := setup(t)
	w, rec := b.startWaker(t, timers)
	at := time.Now().Add(margin)
	owner, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "owner"})
	require.NoError(t, err)
	owner, err = b.engine.Start(b.ctx, owner.ID)
	require.NoError(t, err)
	cancelled := b.sleeper(t, 0, at)
	aborted := b.sleeper(t, 0, at)
	abortedChild := b.sleeper(t, owner.ID, at)
	wokenNow := b.sleeper(t, 0, at)
	sentinel := b.sleeper(t, 0, at.Add(100*time.Millisecond))

	_, errCancel := b.engine.Cancel(b.ctx, cancelled.ID, nil)
	_, errAbort := b.engine.Abort(b.ctx, aborted.ID)
	_, errOwner := b.engine.Abort(b.ctx, owner.ID)
	_, errWake := b.engine.WakeNow(b.ctx, wokenNow.ID)
	if !time.Now().Before(at) {
		require.NoError(t, w.Stop(b.ctx))
		return false
	}
	for _, err := range []error{errCancel, errAbort, errOwner, errWake} {
		require.NoError(t, err)
	}
	left := []int64{cancelled.ID, aborted.ID, abortedChild.ID, wokenNow.ID}
	for _, id := range left {
		// Removed, unless River was moving it at that instant: then
		// it is available or running, and will do nothing.
		for _, s := range b.jobStates(t, id) {
			require.Contains(t, []string{"available", "running", "completed"}, s, "task %d keeps no waiting wake job", id)
		}
	}

	// The sentinel sleeps past the others: once it is woken, their
	// timers have fired and their jobs would have been due.
	b.waitStatus(t, sentinel.ID, arbortype.StatusPending)
	require.NoError(t, w.Stop(b.ctx), "wait for every wake in flight")
	events := rec.all()
	require.Len(t, events, 1, "only the sentinel was woken: %v", events)
	require.Equal(t, sentinel.ID, events[0].TaskID)
	require.Equal(t, arbortype.StatusCancelled, b.status(t, cancelled.ID))
	require.Equal(t, arbortype.StatusAborted, b.status(t, aborted.ID))
	require.Equal(t, arbortype.StatusAborted, b.status(t, abortedChild.ID))
	require.Equal(t, arbortype.StatusPending, b.status(t, wokenNow.ID))
	return true
}

// TestStopLetsAWakeInFlightFinish: a waker stopped while its River worker
// is in a wake's transaction lets that wake commit and reports it, instead
// of cancelling it (River's hard stop, which cancelling its start context
// was without a soft stop): CI once saw a sleep woken with no report, the
// wake's COMMIT answered after the stop had cancelled its context. The
// test holds the sleeping task's row so that the wake waits on it, stops
// the waker, and lets go once the wake has had a second to be cancelled.
func TestStopLetsAWakeInFlightFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, rec := b.startWaker(t, false)
	task := b.sleeper(t, 0, time.Now().Add(300*time.Millisecond))
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.ctx, `SELECT id FROM `+b.schema+`.tasks WHERE id = $1 FOR UPDATE`, task.ID)
	require.NoError(t, err)
	waiting := func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, b.schema) == 1
	}
	waitUntil(t, "the wake to wait on the task's row", waiting)

	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(b.ctx) }()
	// A hard stop cancels the wake's statement at once; a soft one leaves
	// it waiting. Either way the test lets go after a second at most.
	deadline := time.Now().Add(time.Second)
	for waiting() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, tx.Rollback(b.ctx))
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(eventually):
		require.FailNow(t, "the waker never stopped")
	}
	require.Equal(t, arbortype.StatusPending, b.status(t, task.ID), "the wake in flight committed")
	events := rec.all()
	require.Len(t, events, 1, "and was reported: %v", events)
	require.Equal(t, task.ID, events[0].TaskID)
}

func TestPastSleepWakesPromptly(t *testing.T) {
	t.Parallel()
	for name, timers := range map[string]bool{"timers": true, "river alone": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, rec := b.startWaker(t, timers)
			later := b.sleeper(t, 0, time.Now().Add(3*time.Second))
			past := b.sleeper(t, 0, time.Now().Add(-time.Hour))

			b.waitStatus(t, later.ID, arbortype.StatusPending)
			require.Eventually(t, func() bool { return len(rec.all()) == 2 }, eventually, 10*time.Millisecond)
			events := rec.all()
			require.Equal(t, past.ID, events[0].TaskID, "the sleep already due woke before one due later, though it began after it")
			require.Equal(t, later.ID, events[1].TaskID)
		})
	}
}

// TestSleepingAgainGetsItsOwnJob is the trap of River's default unique
// states: a task whose first wake job completed must still get a job, and a
// wake, for its next sleep.
func TestSleepingAgainGetsItsOwnJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, rec := b.startWaker(t, false)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "napper"})
	require.NoError(t, err)
	for i := range 3 {
		task, err = b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		task, err = b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(-time.Millisecond), "nap", nil)
		require.NoError(t, err)
		require.Equal(t, int64(i+1), task.SleepSeq)
		b.waitStatus(t, task.ID, arbortype.StatusPending)
		require.Eventually(t, func() bool { return len(rec.of(task.ID)) == i+1 }, eventually, 10*time.Millisecond)
	}
	require.Eventually(t, func() bool {
		s := b.jobStates(t, task.ID)
		return len(s) == 3 && s[0] == "completed" && s[1] == "completed" && s[2] == "completed"
	}, eventually, 10*time.Millisecond, "one job per sleep")
	for i, ev := range rec.of(task.ID) {
		require.Equal(t, int64(i+1), ev.SleepSeq)
	}
}

// TestRetriesAreWokenByTheWaker runs a handler that always fails: its
// retries sleep and are woken by the waker until the task fails for good.
func TestRetriesAreWokenByTheWaker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, rec := b.startWaker(t, true)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "flaky",
		MaxRetries: 2, RetryBackoffBase: 20 * time.Millisecond, RetryBackoffCap: 40 * time.Millisecond})
	require.NoError(t, err)
	for try := 1; ; try++ {
		b.waitStatus(t, task.ID, arbortype.StatusPending)
		task, err = b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		task, err = b.engine.Fail(b.ctx, task.ID, task.Token, core.NewTaskError(errors.New("upstream 503")))
		require.NoError(t, err)
		if task.Status == arbortype.StatusFailed {
			require.Equal(t, 3, try)
			break
		}
		require.Equal(t, arbortype.StatusSleeping, task.Status)
	}
	require.Len(t, task.ErrorHistory, 3)
	require.NoError(t, w.Stop(b.ctx), "wait for every wake in flight")
	require.Len(t, rec.of(task.ID), 2, "each retry was woken once")
}

func TestWakerConfigIsValidated(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	for field, cfg := range map[string]*machine.WakerConfig{
		"WakerConfig.Horizon":           {Horizon: time.Second, PollInterval: 2 * time.Second},
		"WakerConfig.PollInterval":      {PollInterval: -time.Second},
		"WakerConfig.Workers":           {Workers: -1},
		"WakerConfig.PollLimit":         {PollLimit: -1},
		"WakerConfig.FetchPollInterval": {FetchPollInterval: time.Microsecond},
	} {
		_, err := machine.NewWaker(e, cfg)
		require.ErrorContains(t, err, field)
	}
	w, err := machine.NewWaker(e, nil)
	require.NoError(t, err)
	require.NoError(t, w.Stop(context.Background()), "stopping a waker never started is a no-op")
}

// TestTimersSurviveALostListenConnection kills the waker's LISTEN
// connection: it reconnects, and its timers still wake the sleeps that
// came meanwhile (by the poll that follows every reconnection).
func TestTimersSurviveALostListenConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, rec := b.startWaker(t, true)
	listening := func() (pids []int32) {
		rows, err := b.pool.Query(b.ctx, `SELECT pid FROM pg_stat_activity WHERE query = $1`,
			"LISTEN "+pgx.Identifier{b.engine.C.Store.SleepChannel()}.Sanitize())
		require.NoError(t, err)
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		return pids
	}
	require.Eventually(t, func() bool { return len(listening()) == 1 }, eventually, 10*time.Millisecond)
	old := listening()[0]
	_, err := b.pool.Exec(b.ctx, `SELECT pg_terminate_backend($1)`, old)
	require.NoError(t, err)

	task := b.sleeper(t, 0, time.Now().Add(time.Second))
	b.waitStatus(t, task.ID, arbortype.StatusPending)
	require.Eventually(t, func() bool { return len(rec.of(task.ID)) == 1 }, eventually, 10*time.Millisecond)
	require.Equal(t, machine.WokenByTimer, rec.of(task.ID)[0].By)
	pids := listening()
	require.Len(t, pids, 1, "listening again")
	require.NotEqual(t, old, pids[0])
}

func (b *bundle) get(t testing.TB, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Get(b.ctx, id)
	require.NoError(t, err)
	return task
}

// TestRiverRescuesAWakeJobLeftRunning: a wake job left running in the
// database by a client that lost its database mid-job (after a failover,
// River's completer gives up on the demoted primary and the job's row stays
// running on the new one) is rescued after RescueStuckJobsAfter and wakes
// its sleep, with no timer to cover it; River's own default would leave the
// sleep for an hour.
func TestRiverRescuesAWakeJobLeftRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := b.sleeper(t, 0, time.Now().Add(-time.Second))
	// The job as a lost client leaves it: running, attempted a while ago,
	// by a client that is gone.
	tag, err := b.pool.Exec(b.ctx, `UPDATE `+pgx.Identifier{b.schema, "river_job"}.Sanitize()+
		` SET state = 'running', attempt = 1, attempted_at = now() - interval '10 seconds', attempted_by = '{gone}'
		 WHERE kind = 'arbor_wake' AND (args->>'task_id')::bigint = $1`, task.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	rec := &recorder{ch: make(chan machine.Wake, 16)}
	w, err := machine.NewWaker(b.engine.Engine, &machine.WakerConfig{
		DisableTimers:        true,
		RescueStuckJobsAfter: 5 * time.Second,
		OnWake:               rec.record,
		RiverTestOnly:        true,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(b.ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })

	b.waitStatus(t, task.ID, arbortype.StatusPending)
	// OnWake is called after the wake's commit: the status may be seen
	// first.
	require.Eventually(t, func() bool { return len(rec.of(task.ID)) == 1 }, eventually, 10*time.Millisecond, "the waker reports the wake")
	require.Equal(t, machine.WokenByRiver, rec.of(task.ID)[0].By)
	require.Eventually(t, func() bool {
		st := b.jobStates(t, task.ID)
		return len(st) == 1 && st[0] == "completed"
	}, eventually, 10*time.Millisecond, "the rescued job ran again and completed")
}

// TestWakerRescueAfterIsValidated: a rescue interval below a second is
// refused (River would rescue jobs still being worked).
func TestWakerRescueAfterIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := machine.NewWaker(b.engine.Engine, &machine.WakerConfig{RescueStuckJobsAfter: time.Millisecond})
	require.ErrorContains(t, err, "RescueStuckJobsAfter")
}
