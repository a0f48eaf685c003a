package core_test

import (
	"context"
	"encoding/json"
	"errors"
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

// These tests run without any started River client: the wake jobs the
// engine inserts stay where they are, so the tests can look at them. The
// River worker and the timers are tested in package machine.

type sleepBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *enginetest.Engine
	schema string
	conv   string
}

func setupSleep(t *testing.T, cfg *tasks.Config) *sleepBundle {
	t.Helper()
	pool, schema := testdb.Shared(t)
	if cfg == nil {
		cfg = &tasks.Config{}
	}
	cfg.Schema = schema
	b := &sleepBundle{ctx: context.Background(), pool: pool, engine: enginetest.New(t, pool, cfg), schema: schema, conv: testdb.Conversation(t)}
	t.Cleanup(func() { b.requireInvariant(t) })
	return b
}

// requireInvariant fails the test if invariant 5 does not hold for its
// conversation; every test ends with it.
func (b *sleepBundle) requireInvariant(t *testing.T) {
	t.Helper()
	require.Empty(t, sleepViolations(t, b))
}

// sleepViolations returns the checker's violations of invariant 5 and of
// the retry bound over the test's conversation.
func sleepViolations(t *testing.T, b *sleepBundle) []string {
	t.Helper()
	return b.engine.SleepViolations(t, b.ctx, b.conv)
}

// running creates a task in the test's conversation and starts it.
func (b *sleepBundle) running(t *testing.T, p arbortype.CreateParams) arbortype.Task {
	t.Helper()
	p.ConversationID = b.conv
	if p.Kind == "" {
		p.Kind = "sleeper"
	}
	task, _, err := b.engine.Create(b.ctx, p)
	require.NoError(t, err)
	task, err = b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	return task
}

func (b *sleepBundle) get(t *testing.T, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Get(b.ctx, id)
	require.NoError(t, err)
	return task
}

type wakeJob struct {
	ID          int64
	State       string
	Queue       string
	ScheduledAt time.Time
	Args        core.WakeArgs
}

// wakeJobs returns every wake job of a task, finished ones included.
func (b *sleepBundle) wakeJobs(t *testing.T, taskID int64) []wakeJob {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT id, state::text, queue, scheduled_at, args FROM `+
		pgx.Identifier{b.schema, "river_job"}.Sanitize()+
		` WHERE kind = 'arbor_wake' AND (args->>'task_id')::bigint = $1 ORDER BY id`, taskID)
	require.NoError(t, err)
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (wakeJob, error) {
		var (
			j    wakeJob
			args []byte
		)
		if err := row.Scan(&j.ID, &j.State, &j.Queue, &j.ScheduledAt, &args); err != nil {
			return j, err
		}
		return j, json.Unmarshal(args, &j.Args)
	})
	require.NoError(t, err)
	return jobs
}

func TestSleepUntilParksWithOneWakeJob(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	wakeAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)

	slept, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, wakeAt, "napping", json.RawMessage(`{"step":2}`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusSleeping, slept.Status)
	require.Equal(t, int64(1), slept.SleepSeq)
	require.True(t, wakeAt.Equal(*slept.WakeAt))
	require.Equal(t, "napping", slept.Phase)
	require.JSONEq(t, `{"step":2}`, string(slept.State))
	require.Zero(t, slept.Token, "a sleeping task has no holder")

	jobs := b.wakeJobs(t, task.ID)
	require.Len(t, jobs, 1)
	require.Equal(t, slept.WakeJobID, jobs[0].ID)
	require.Equal(t, "scheduled", jobs[0].State)
	require.Equal(t, core.WakeQueue, jobs[0].Queue)
	require.True(t, wakeAt.Equal(jobs[0].ScheduledAt), "the job is scheduled at the wake time")
	require.Equal(t, core.WakeArgs{TaskID: task.ID, SleepSeq: 1, ConversationID: b.conv}, jobs[0].Args)

	_, err = b.engine.Checkpoint(b.ctx, task.ID, task.Token, "late", nil)
	require.ErrorIs(t, err, arbortype.ErrNotRunning, "the run that slept no longer holds the task")
}

func TestSleepUntilBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	pending, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "idle"})
	require.NoError(t, err)
	wakeAt := time.Now().Add(time.Minute)

	for name, tc := range map[string]struct {
		id, token int64
		at        time.Time
		state     json.RawMessage
		want      error
	}{
		"stale token":   {task.ID, task.Token + 1000, wakeAt, nil, arbortype.ErrLeaseLost},
		"not running":   {pending.ID, 1, wakeAt, nil, arbortype.ErrNotRunning},
		"unknown task":  {1 << 60, 1, wakeAt, nil, arbortype.ErrNotFound},
		"zero time":     {task.ID, task.Token, time.Time{}, nil, arbortype.ErrInvalidArgument},
		"bad state":     {task.ID, task.Token, wakeAt, json.RawMessage(`{`), arbortype.ErrInvalidJSON},
		"out of range":  {task.ID, task.Token, time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), nil, arbortype.ErrInvalidArgument},
		"no such token": {task.ID, 0, wakeAt, nil, arbortype.ErrLeaseLost},
	} {
		_, err := b.engine.SleepUntil(b.ctx, tc.id, tc.token, tc.at, "p", tc.state)
		require.ErrorIs(t, err, tc.want, name)
	}
	require.Equal(t, task, b.get(t, task.ID), "the running task is untouched")
	require.Equal(t, pending, b.get(t, pending.ID), "the pending task is untouched")
	require.Empty(t, b.wakeJobs(t, task.ID))
	require.Empty(t, b.wakeJobs(t, pending.ID))

	_, err = b.engine.Abort(b.ctx, task.ID)
	require.NoError(t, err)
	_, err = b.engine.SleepUntil(b.ctx, task.ID, task.Token, wakeAt, "p", nil)
	require.ErrorIs(t, err, arbortype.ErrAborted)
	require.Empty(t, b.wakeJobs(t, task.ID))
}

func TestSleepUntilTxRollsBackWithTheCaller(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	slept, err := b.engine.SleepUntilTx(b.ctx, tx, task.ID, task.Token, time.Now().Add(time.Minute), "p", nil)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusSleeping, slept.Status)
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, arbortype.StatusRunning, b.get(t, task.ID).Status)
	require.Empty(t, b.wakeJobs(t, task.ID), "the wake job went with the rolled-back sleep")
}

func TestWakeSleepingIsIdempotentPerSleep(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})

	// A sleep whose time has passed: the first wake of that sleep wins.
	slept, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(-time.Second), "p", nil)
	require.NoError(t, err)
	jobs := b.wakeJobs(t, task.ID)
	require.Len(t, jobs, 1)
	require.Equal(t, "available", jobs[0].State, "a due sleep's job need not wait for River's scheduler")
	woken, err := b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq-1)
	require.NoError(t, err)
	require.False(t, woken, "an older sleep's wake does nothing")
	require.Equal(t, arbortype.StatusSleeping, b.get(t, task.ID).Status)

	woken, err = b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq)
	require.NoError(t, err)
	require.True(t, woken)
	after := b.get(t, task.ID)
	require.Equal(t, arbortype.StatusPending, after.Status)
	require.Empty(t, b.wakeJobs(t, task.ID), "a timer's wake removes the sleep's job")

	woken, err = b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq)
	require.NoError(t, err)
	require.False(t, woken, "a second delivery does nothing")
	require.Equal(t, after, b.get(t, task.ID))

	// Sleeping again is a new sleep with a job of its own, whatever became
	// of the first one's.
	task, err = b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	again, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(time.Hour), "p2", nil)
	require.NoError(t, err)
	require.Equal(t, slept.SleepSeq+1, again.SleepSeq)
	jobs = b.wakeJobs(t, task.ID)
	require.Len(t, jobs, 1)
	require.Equal(t, again.SleepSeq, jobs[0].Args.SleepSeq)

	woken, err = b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq)
	require.NoError(t, err)
	require.False(t, woken, "the first sleep's wake does not end the second sleep")

	_, err = b.engine.WakeSleeping(b.ctx, 1<<60, 1)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
}

func TestWakeSleepingBeforeTheWakeTimeIsRefused(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	slept, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(time.Hour), "p", nil)
	require.NoError(t, err)

	woken, err := b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq)
	require.False(t, woken)
	require.ErrorIs(t, err, core.ErrNotDue)
	var notDue *core.NotDueError
	require.ErrorAs(t, err, &notDue)
	require.Positive(t, notDue.Remaining())
	require.Equal(t, slept, b.get(t, task.ID), "nothing is written")
	require.Len(t, b.wakeJobs(t, task.ID), 1)
}

func TestWakeNowRemovesTheWakeJob(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	slept, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(time.Hour), "p", nil)
	require.NoError(t, err)

	woken, err := b.engine.WakeNow(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, woken.Status)
	require.Empty(t, b.wakeJobs(t, task.ID))

	again, err := b.engine.WakeSleeping(b.ctx, task.ID, slept.SleepSeq)
	require.NoError(t, err)
	require.False(t, again, "the sleep's timer finds it over")

	_, err = b.engine.WakeNow(b.ctx, task.ID)
	require.ErrorIs(t, err, arbortype.ErrNotSleeping)
	require.Equal(t, woken, b.get(t, task.ID), "a refused wake writes nothing")
	_, err = b.engine.WakeNow(b.ctx, 1<<60)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
}

func TestWakeNowTxRollsBackWithTheCaller(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	task := b.running(t, arbortype.CreateParams{})
	slept, err := b.engine.SleepUntil(b.ctx, task.ID, task.Token, time.Now().Add(time.Hour), "p", nil)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.engine.WakeNowTx(b.ctx, tx, task.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, slept, b.get(t, task.ID))
	require.Len(t, b.wakeJobs(t, task.ID), 1, "the job is back with the sleep")
}

func TestLeavingASleepRemovesItsWakeJob(t *testing.T) {
	t.Parallel()
	hour := time.Now().Add(time.Hour)
	for name, leave := range map[string]func(b *sleepBundle, t *testing.T, sleeper arbortype.Task) arbortype.Status{
		"cancel": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.Cancel(b.ctx, s.ID, nil)
			require.NoError(t, err)
			return arbortype.StatusCancelled
		},
		"abort": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.Abort(b.ctx, s.ID)
			require.NoError(t, err)
			return arbortype.StatusAborted
		},
		"abort of its owner": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.Abort(b.ctx, s.OwnerID)
			require.NoError(t, err)
			return arbortype.StatusAborted
		},
		"cancel of its owner": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.Cancel(b.ctx, s.OwnerID, nil)
			require.NoError(t, err)
			return arbortype.StatusAborted
		},
		"abort of the conversation": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.AbortConversation(b.ctx, b.conv)
			require.NoError(t, err)
			return arbortype.StatusAborted
		},
		"early wake": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			_, err := b.engine.WakeNow(b.ctx, s.ID)
			require.NoError(t, err)
			return arbortype.StatusPending
		},
		"fail_fast sibling": func(b *sleepBundle, t *testing.T, s arbortype.Task) arbortype.Status {
			owner := b.get(t, s.OwnerID)
			sibling := b.running(t, arbortype.CreateParams{OwnerID: owner.ID, Kind: "sibling"})
			res, err := b.engine.WaitForChildren(b.ctx, owner.ID, owner.Token, core.WaitParams{
				ChildIDs: []int64{s.ID, sibling.ID}, Policy: arbortype.FailFast})
			require.NoError(t, err)
			require.False(t, res.Woken)
			_, err = b.engine.Fail(b.ctx, sibling.ID, sibling.Token, arbortype.TaskError{Message: "boom"})
			require.NoError(t, err)
			require.Equal(t, arbortype.StatusPending, b.get(t, owner.ID).Status, "fail_fast woke the owner")
			return arbortype.StatusAborted
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupSleep(t, nil)
			owner := b.running(t, arbortype.CreateParams{Kind: "owner"})
			child := b.running(t, arbortype.CreateParams{OwnerID: owner.ID, Kind: "child"})
			grandchild := b.running(t, arbortype.CreateParams{OwnerID: child.ID, Kind: "grandchild"})
			slept, err := b.engine.SleepUntil(b.ctx, child.ID, child.Token, hour, "p", nil)
			require.NoError(t, err)
			_, err = b.engine.SleepUntil(b.ctx, grandchild.ID, grandchild.Token, hour, "p", nil)
			require.NoError(t, err)
			require.Len(t, b.wakeJobs(t, child.ID), 1)

			want := leave(b, t, slept)

			require.Equal(t, want, b.get(t, child.ID).Status)
			require.Empty(t, b.wakeJobs(t, child.ID), "no job is left for a sleep that is over")
			woken, err := b.engine.WakeSleeping(b.ctx, child.ID, slept.SleepSeq)
			require.NoError(t, err)
			require.False(t, woken, "its timer causes no wake")
			if b.get(t, grandchild.ID).Status.Settled() {
				require.Empty(t, b.wakeJobs(t, grandchild.ID), "nor for a descendant's")
			}
		})
	}
}

func TestRetriesFollowThePolicyAndEndFailed(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	base, ceiling := 2*time.Millisecond, 5*time.Millisecond
	task := b.running(t, arbortype.CreateParams{MaxRetries: 2, RetryBackoffBase: base, RetryBackoffCap: ceiling})
	require.Equal(t, base, task.RetryBackoffBase)
	require.Equal(t, ceiling, task.RetryBackoffCap)

	// Each nominal delay: min(cap, base·2^retry); the wait is in its upper half.
	for retry, nominal := range []time.Duration{2 * time.Millisecond, 4 * time.Millisecond} {
		parked, err := b.engine.Fail(b.ctx, task.ID, task.Token, arbortype.TaskError{Code: "flaky", Message: "try " + string(rune('1'+retry))})
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusSleeping, parked.Status, "retry %d", retry)
		require.Equal(t, retry+1, parked.Retries)
		require.Equal(t, "try "+string(rune('1'+retry)), parked.Error.Message)
		require.Len(t, parked.ErrorHistory, retry+1)
		// wake_at and updated_at come from the same statement's now().
		wait := parked.WakeAt.Sub(parked.UpdatedAt)
		require.GreaterOrEqual(t, wait, nominal/2, "retry %d", retry)
		require.LessOrEqual(t, wait, nominal, "retry %d", retry)
		jobs := b.wakeJobs(t, task.ID)
		require.Contains(t, []string{"scheduled", "available"}, jobs[len(jobs)-1].State,
			"a live job (available when the backoff was already over at insert)")
		require.Equal(t, parked.SleepSeq, jobs[len(jobs)-1].Args.SleepSeq)
		b.requireInvariant(t)

		woken := false
		for !woken {
			woken, err = b.engine.WakeSleeping(b.ctx, task.ID, parked.SleepSeq)
			if errors.Is(err, core.ErrNotDue) {
				continue
			}
			require.NoError(t, err)
		}
		task, err = b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, 0, task.Attempt, "a retry is not a recovery")
	}

	failed, err := b.engine.Fail(b.ctx, task.ID, task.Token, arbortype.TaskError{Message: "try 3"})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusFailed, failed.Status, "no retry left")
	require.Equal(t, 2, failed.Retries)
	require.Equal(t, "try 3", failed.Error.Message)
	require.Len(t, failed.ErrorHistory, 3)
	for i, try := range failed.ErrorHistory {
		require.Equal(t, i+1, try.Try)
		require.Equal(t, "try "+string(rune('1'+i)), try.Message)
		require.False(t, try.At.IsZero())
	}
	require.Equal(t, "flaky", failed.ErrorHistory[0].Code)
}

func TestNonRetryableFailsAtOnce(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	for _, taskErr := range []arbortype.TaskError{
		core.NewTaskError(machine.NonRetryable(errors.New("bad request"))),
		{Message: "marked by hand", NonRetryable: true},
	} {
		task := b.running(t, arbortype.CreateParams{MaxRetries: 3})
		failed, err := b.engine.Fail(b.ctx, task.ID, task.Token, taskErr)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusFailed, failed.Status)
		require.Zero(t, failed.Retries)
		require.True(t, failed.Error.NonRetryable)
		require.Len(t, failed.ErrorHistory, 1)
		require.True(t, failed.ErrorHistory[0].NonRetryable)
		require.Empty(t, b.wakeJobs(t, task.ID))
	}

	wrapped := machine.NonRetryable(context.DeadlineExceeded)
	require.ErrorIs(t, wrapped, arbortype.ErrNonRetryable)
	require.ErrorIs(t, wrapped, context.DeadlineExceeded, "the marker keeps the cause")
	require.False(t, core.NewTaskError(errors.New("transient")).NonRetryable)
	require.NoError(t, machine.NonRetryable(nil))

	// Recovery's failure (past the restart limit) is final too.
	task := b.running(t, arbortype.CreateParams{MaxRetries: 3})
	failed, err := b.engine.ForceFail(b.ctx, task.ID, arbortype.TaskError{Code: arbortype.CodeRestartLimitExceeded, Message: "gone"})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusFailed, failed.Status)
}

func TestErrorHistoryIsBounded(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, &tasks.Config{ErrorHistoryLimit: 2, RetryBackoffBase: time.Microsecond, RetryBackoffCap: time.Microsecond})
	task := b.running(t, arbortype.CreateParams{MaxRetries: 3})
	for i := range 4 {
		got, err := b.engine.Fail(b.ctx, task.ID, task.Token, arbortype.TaskError{Message: string(rune('a' + i))})
		require.NoError(t, err)
		if got.Status == arbortype.StatusFailed {
			require.Equal(t, 3, i)
			require.Len(t, got.ErrorHistory, 2, "only the newest entries are kept")
			require.Equal(t, []int{3, 4}, []int{got.ErrorHistory[0].Try, got.ErrorHistory[1].Try})
			require.Equal(t, "d", got.ErrorHistory[1].Message)
			return
		}
		for {
			woken, err := b.engine.WakeSleeping(b.ctx, task.ID, got.SleepSeq)
			if woken {
				break
			}
			require.ErrorIs(t, err, core.ErrNotDue)
		}
		task, err = b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
	}
	t.Fatal("the task never failed")
}

func TestRetryPolicyBadInput(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	for _, p := range []arbortype.CreateParams{
		{RetryBackoffBase: time.Minute, RetryBackoffCap: time.Second},
		{RetryBackoffBase: -time.Second},
		{RetryBackoffCap: 30 * 24 * time.Hour},
		{MaxRetries: -1},
	} {
		p.ConversationID, p.Kind = b.conv, "k"
		_, _, err := b.engine.Create(b.ctx, p)
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	}
	_, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound, "nothing written, not even the conversation")

	pool, schema := testdb.Shared(t)
	_, err = tasks.New(b.ctx, pool, &tasks.Config{Schema: schema, RetryBackoffBase: time.Hour, RetryBackoffCap: time.Minute})
	require.ErrorContains(t, err, "Config.RetryBackoff")
	_, err = tasks.New(b.ctx, pool, &tasks.Config{Schema: schema, ErrorHistoryLimit: -1})
	require.ErrorContains(t, err, "Config.ErrorHistoryLimit")

	// A base above the default cap, without a cap, raises the cap with it.
	task := b.running(t, arbortype.CreateParams{RetryBackoffBase: time.Hour})
	require.Equal(t, time.Hour, task.RetryBackoffCap)
	d := b.running(t, arbortype.CreateParams{})
	require.Equal(t, tasks.RetryBackoffBaseDefault, d.RetryBackoffBase)
	require.Equal(t, tasks.RetryBackoffCapDefault, d.RetryBackoffCap)
}

func TestCheckSleepingReportsViolations(t *testing.T) {
	t.Parallel()
	b := setupSleep(t, nil)
	sleeper := b.running(t, arbortype.CreateParams{})
	slept, err := b.engine.SleepUntil(b.ctx, sleeper.ID, sleeper.Token, time.Now().Add(time.Hour), "p", nil)
	require.NoError(t, err)
	jobs := b.wakeJobs(t, sleeper.ID)
	require.Len(t, jobs, 1)
	riverJob := pgx.Identifier{b.schema, "river_job"}.Sanitize()

	// A sleep whose job went missing.
	_, err = b.pool.Exec(b.ctx, `UPDATE `+riverJob+` SET state = 'discarded', finalized_at = now() WHERE id = $1`, jobs[0].ID)
	require.NoError(t, err)
	violations := sleepViolations(t, b)
	require.Len(t, violations, 1)
	require.Contains(t, violations[0], "without a live wake job")

	// A job left behind by a sleep that is over.
	_, err = b.pool.Exec(b.ctx, `UPDATE `+riverJob+` SET state = 'scheduled', finalized_at = NULL WHERE id = $1`, jobs[0].ID)
	require.NoError(t, err)
	_, err = b.engine.WakeNow(b.ctx, slept.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO `+riverJob+` (args, kind, max_attempts, queue, state, scheduled_at)
		VALUES ($1, 'arbor_wake', 25, 'arbor_wake', 'scheduled', now() + interval '1 hour')`,
		core.WakeArgs{TaskID: slept.ID, SleepSeq: slept.SleepSeq, ConversationID: b.conv})
	require.NoError(t, err)
	violations = sleepViolations(t, b)
	require.Len(t, violations, 1)
	require.Contains(t, violations[0], "is left for sleep 1, but the task is pending")

	_, err = b.pool.Exec(b.ctx, `DELETE FROM `+riverJob+` WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('conversation_id', $1::text)`, b.conv)
	require.NoError(t, err)
}
