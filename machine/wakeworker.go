package machine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// wakeWorker is the River worker of the wake queue: it ends the sleep its
// job names through the engine's one wake path and completes the job in the
// same transaction, so a wake and its job's completion commit together. A
// job whose sleep is already over (woken by a timer or a user, cancelled,
// aborted, or the task sleeping again) does nothing and completes.
type wakeWorker struct {
	river.WorkerDefaults[core.WakeArgs]

	core   *core.Engine
	onWake func(Wake)
	logger *slog.Logger
}

// newWakeWorker returns a worker that wakes tasks of c. onWake, if not nil,
// is called after each wake this worker committed.
func newWakeWorker(c *core.Engine, onWake func(Wake), logger *slog.Logger) *wakeWorker {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &wakeWorker{core: c, onWake: onWake, logger: logger}
}

// Work wakes the job's sleep. Before the wake time by the database's clock
// (River ran the job early: the clocks of River's leader and the database
// differ) the job is snoozed for what remains; a task that does not exist
// cancels the job, since it can never be woken; any other error is
// returned for River to retry the job.
func (w *wakeWorker) Work(ctx context.Context, job *river.Job[core.WakeArgs]) error {
	var woken bool
	err := pgx.BeginTxFunc(ctx, w.core.Pool, w.core.TxOptions(), func(tx pgx.Tx) error {
		var err error
		woken, err = w.core.WakeSleeping(ctx, tx, job.Args.TaskID, job.Args.SleepSeq)
		if err != nil {
			return err
		}
		_, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
	var notDue *core.NotDueError
	switch {
	case errors.As(err, &notDue):
		return river.JobSnooze(max(notDue.Remaining(), time.Millisecond))
	case errors.Is(err, arbortype.ErrNotFound):
		w.logger.WarnContext(ctx, "arbor: wake job for a task that does not exist",
			slog.Int64("task_id", job.Args.TaskID), slog.Int64("job_id", job.ID))
		return river.JobCancel(err)
	case err != nil:
		return err
	}
	if woken && w.onWake != nil {
		w.onWake(Wake{TaskID: job.Args.TaskID, SleepSeq: job.Args.SleepSeq, ConversationID: job.Args.ConversationID, By: WokenByRiver,
			Late: max(time.Since(job.ScheduledAt), 0)})
	}
	return nil
}
