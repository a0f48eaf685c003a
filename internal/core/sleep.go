package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Sleep and wake (docs/design.md §3.7). A sleep is durable: the task's row says
// sleeping with a wake time and a sleep number (sleep_seq), and a River job
// scheduled at the wake time, inserted in the same transaction, will wake
// it. Every wake of a sleep goes through one idempotent path that locks the
// conversation row first and wakes the task only if it is still sleeping
// from that same sleep, so the River job, a local timer and a user's early
// wake may all race: one of them wakes the task, the others do nothing.

// WakeQueue is the River queue that wake jobs are inserted into. The River
// client that works it is started by package machine.
const WakeQueue = "arbor_wake"

// wakeJobMaxAttempts is how many times River runs a wake job whose worker
// failed (a lost connection, a database restart) before discarding it; with
// River's default retry policy the last attempt comes days later.
const wakeJobMaxAttempts = 25

// WakeArgs are the arguments of a wake job.
type WakeArgs struct {
	// TaskID and SleepSeq name the sleep the job ends: the task is woken
	// only if it is still sleeping with this sleep_seq.
	TaskID   int64 `json:"task_id" river:"unique"`
	SleepSeq int64 `json:"sleep_seq" river:"unique"`
	// ConversationID lets the checker and operators find a conversation's
	// wake jobs, and keeps the job with its conversation's shard.
	ConversationID string `json:"conversation_id"`
}

// Kind is the River job kind of wake jobs.
func (WakeArgs) Kind() string { return store.WakeJobKind }

// InsertOpts makes wake jobs unique per sleep while they are live.
//
// River's default unique states include completed (and discarded, until
// its cleaner removes them, a day later by default), so a job unique by
// task alone would make the task's next sleep a silent duplicate of its
// finished one and leave that sleep without a job. Uniqueness here is by
// (task_id, sleep_seq) and only over the live states: a task that sleeps
// many times gets one job per sleep, and a second insert for the same sleep
// (a retried transaction, a repair that re-inserts a missing job) returns
// the live job instead of adding another. retryable is kept in the set so
// that a wake job being retried by River still counts as the sleep's job.
func (WakeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       WakeQueue,
		MaxAttempts: wakeJobMaxAttempts,
		UniqueOpts: river.UniqueOpts{
			ByArgs: true,
			ByState: []rivertype.JobState{
				rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
				rivertype.JobStateRunning, rivertype.JobStateScheduled,
			},
		},
	}
}

// ErrNotDue is WakeSleeping's error before the sleep's wake time by the database's
// clock. Matched by every *NotDueError.
var ErrNotDue = errors.New("wake time has not come")

// NotDueError says that a sleep's wake time has not come yet, by the
// database's clock: a timer fired early (the clocks of the waker and the
// database differ). The caller tries again after Remaining.
type NotDueError struct {
	TaskID     int64
	WakeAt     time.Time
	DatabaseAt time.Time
}

func (e *NotDueError) Error() string {
	return fmt.Sprintf("task %d: wake time %s has not come (database time %s)",
		e.TaskID, e.WakeAt.Format(time.RFC3339Nano), e.DatabaseAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrNotDue) true.
func (e *NotDueError) Is(target error) bool { return target == ErrNotDue }

// Remaining is how long until the wake time, by the database's clock.
func (e *NotDueError) Remaining() time.Duration { return e.WakeAt.Sub(e.DatabaseAt) }

// newWakeJobClient returns the insert-only River client the engine inserts
// wake jobs with. It has no queues and is never started: River's
// scheduler, which turns due jobs into available ones, runs only in a
// started client (package machine's).
func newWakeJobClient(pool *pgxpool.Pool, cfg Config) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: cfg.Schema, Logger: cfg.Logger})
}

// SleepUntil parks the running task held with token until wakeAt (see
// machine.Run.SleepUntil).
func (e *Engine) SleepUntil(ctx context.Context, tx pgx.Tx, taskID, token int64, wakeAt time.Time, phase string, state json.RawMessage) (Task, error) {
	if wakeAt.IsZero() {
		return Task{}, errorf("sleep", taskID, fmt.Errorf("wake time is zero: %w", arbortype.ErrInvalidArgument))
	}
	// PostgreSQL's timestamptz and River's JSON both need years 1 to 9999,
	// in UTC (the value's own zone may say otherwise).
	if y := wakeAt.UTC().Year(); y < 1 || y > 9999 {
		return Task{}, errorf("sleep", taskID, fmt.Errorf("wake time %s is out of range: %w", wakeAt, arbortype.ErrInvalidArgument))
	}
	if err := checkText("phase", phase, false); err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	if err := e.checkJSON("state", state); err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	// A sleep changes one task, but it must serialise with the wakes, cancels
	// and aborts of its conversation, which lock the conversation first.
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	to, err := fsm.Transition(t.Status, fsm.Sleep)
	if err != nil {
		return Task{}, errorf("sleep", taskID, transitionError(taskID, t.Status, fsm.Sleep))
	}
	jobID, err := e.insertWakeJob(ctx, tx, t, wakeAt)
	if err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	slept, err := e.Store.SleepTask(ctx, tx, t.ConversationID, taskID, to, phase, state, wakeAt, jobID)
	if err != nil {
		return Task{}, errorf("sleep", taskID, mapDBError(err))
	}
	if err := e.announceSleep(ctx, tx, slept); err != nil {
		return Task{}, errorf("sleep", taskID, err)
	}
	return slept, nil
}

// insertWakeJob inserts the wake job of t's next sleep (t is locked and
// running; the sleep will be number sleep_seq + 1) at wakeAt, and returns
// its id. It comes before the task's own write, so that the task is
// written once, with its job (see the column guard).
func (e *Engine) insertWakeJob(ctx context.Context, tx pgx.Tx, t Task, wakeAt time.Time) (int64, error) {
	// River inserts any job with a ScheduledAt as scheduled, even one in
	// the past, and only its scheduler (every ~5 s) makes it available. A
	// sleep that is already due is inserted available instead, which River
	// announces to its workers at once.
	due, _, err := e.Store.DueNow(ctx, tx, wakeAt)
	if err != nil {
		return 0, err
	}
	opts := &river.InsertOpts{ScheduledAt: wakeAt}
	if due {
		opts.ScheduledAt = time.Time{}
	}
	res, err := e.wakeJobs.InsertTx(ctx, tx, WakeArgs{TaskID: t.ID, SleepSeq: t.SleepSeq + 1, ConversationID: t.ConversationID}, opts)
	if err != nil {
		return 0, fmt.Errorf("insert wake job: %w", err)
	}
	return res.Job.ID, nil
}

// announceSleep tells wakers of t's new sleep (delivered at commit).
func (e *Engine) announceSleep(ctx context.Context, tx pgx.Tx, t Task) error {
	if t.WakeAt == nil {
		return fmt.Errorf("sleeping task %d has no wake time", t.ID)
	}
	err := e.Store.NotifySleep(ctx, tx, store.SleepNotice{TaskID: t.ID, ConversationID: t.ConversationID, SleepSeq: t.SleepSeq, WakeAt: *t.WakeAt})
	if err != nil {
		return fmt.Errorf("notify sleep: %w", err)
	}
	return nil
}

// WakeNow is a user's early wake of a sleeping task (see tasks.Engine.WakeNow).
func (e *Engine) WakeNow(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("wake", taskID, err)
	}
	if t.Status != arbortype.StatusSleeping {
		return Task{}, errorf("wake", taskID, fmt.Errorf("%w (it is %s)", arbortype.ErrNotSleeping, t.Status))
	}
	woken, err := e.wakeLocked(ctx, tx, t)
	if err != nil {
		return Task{}, errorf("wake", taskID, err)
	}
	return woken, nil
}

// WakeSleeping wakes taskID (sleeping → pending) if it is still sleeping
// from sleep sleepSeq and that sleep's wake time has come by the database's
// clock. It is the one path of every timed wake, the River worker's and the
// local timers', and it is idempotent: a task already woken, cancelled,
// aborted or sleeping again (a later sleep_seq) is not an error, woken is
// false and nothing is written. Before the wake time the error is a
// *NotDueError (ErrNotDue). An unknown task is ErrNotFound.
func (e *Engine) WakeSleeping(ctx context.Context, tx pgx.Tx, taskID, sleepSeq int64) (bool, error) {
	// sleep_seq only grows, so a task seen past this sleep without a lock
	// can never be in it again: a second delivery costs no lock at all.
	cur, err := e.Store.GetTask(ctx, tx, taskID)
	switch {
	case store.IsNoRows(err):
		return false, errorf("wake", taskID, arbortype.ErrNotFound)
	case err != nil:
		return false, errorf("wake", taskID, err)
	case !sleepingIn(cur, sleepSeq):
		return false, nil
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return false, errorf("wake", taskID, err)
	}
	if !sleepingIn(t, sleepSeq) {
		return false, nil
	}
	if t.WakeAt == nil {
		return false, errorf("wake", taskID, fmt.Errorf("sleeping without a wake time: %w", arbortype.ErrInvalidTransition))
	}
	due, now, err := e.Store.DueNow(ctx, tx, *t.WakeAt)
	if err != nil {
		return false, errorf("wake", taskID, err)
	}
	if !due {
		return false, errorf("wake", taskID, &NotDueError{TaskID: taskID, WakeAt: *t.WakeAt, DatabaseAt: now})
	}
	if _, err := e.wakeLocked(ctx, tx, t); err != nil {
		return false, errorf("wake", taskID, err)
	}
	return true, nil
}

func sleepingIn(t Task, sleepSeq int64) bool {
	return t.Status == arbortype.StatusSleeping && t.SleepSeq == sleepSeq
}

// wakeLocked wakes t, a locked waiting or sleeping task (pending), removing
// the wake job of a sleep.
func (e *Engine) wakeLocked(ctx context.Context, tx pgx.Tx, t Task) (Task, error) {
	if t.Status == arbortype.StatusSleeping && t.AwaitName != "" {
		// An await's timeout (or a user's early wake of it): woken with no
		// event, and the handler told so.
		return e.deliverLocked(ctx, tx, t, nil)
	}
	to, err := fsm.Transition(t.Status, fsm.Wake)
	if err != nil {
		return Task{}, transitionError(t.ID, t.Status, fsm.Wake)
	}
	if err := e.dropWakeJobs(ctx, tx, t); err != nil {
		return Task{}, err
	}
	woken, err := e.Store.WakeTask(ctx, tx, t.ConversationID, t.ID, to)
	if err != nil {
		return Task{}, mapDBError(err)
	}
	return woken, nil
}

// dropWakeJobs removes the wake jobs of the sleeping tasks among ts, which
// are locked and about to leave their sleep (woken, cancelled, aborted) in
// this transaction. It is the hook that keeps invariant 5 of docs/design.md §4
// from the other side: no task that left its sleep keeps a job waiting for
// it. A job River is running, or moving at that moment (its scheduler or a
// producer holds the row), is left alone rather than waited for: it runs,
// finds the sleep over and does nothing.
func (e *Engine) dropWakeJobs(ctx context.Context, tx pgx.Tx, ts ...Task) error {
	var ids []int64
	for _, t := range ts {
		if t.Status == arbortype.StatusSleeping && t.WakeJobID != 0 {
			ids = append(ids, t.WakeJobID)
		}
	}
	if _, err := e.Store.DeleteWakeJobs(ctx, tx, ids); err != nil {
		return fmt.Errorf("remove wake jobs: %w", err)
	}
	return nil
}
