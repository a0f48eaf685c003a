package machine

import (
	"context"
	"log/slog"

	"github.com/riverqueue/river"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// pruneWorker is the River worker of the periodic prune job (River's
// leader inserts one every tasks.Config.PruneInterval, and at its start):
// it deletes the log entries older than tasks.Config.LogRetention and,
// when tasks.Config.Retention is set, the settled history older than it
// (tasks.Engine.Prune). One node runs each job; the prune's own
// transactions make a concurrent prune harmless.
type pruneWorker struct {
	river.WorkerDefaults[core.PruneArgs]

	core   *core.Engine
	logger *slog.Logger
}

// logPruneBatch is how many log entries one statement deletes.
const logPruneBatch = 10_000

// Work prunes; an error is returned for River to retry the job (what
// committed before it stays pruned).
func (w *pruneWorker) Work(ctx context.Context, _ *river.Job[core.PruneArgs]) error {
	var logEntries int64
	for {
		n, err := w.core.PruneLog(ctx, w.core.Cfg.LogRetention, logPruneBatch)
		if err != nil {
			return err
		}
		logEntries += n
		if n < logPruneBatch {
			break
		}
	}
	// River keeps finished jobs for a day (its cleaner's default): the
	// prune's own would pile up one per PruneInterval. The newest few are
	// kept, to show when the prune last ran.
	jobs, err := core.Write(ctx, w.core, func(db store.DB) (int64, error) {
		return w.core.Store.PruneFinishedPruneJobs(ctx, db, 10*w.core.Cfg.PruneInterval)
	})
	if err != nil {
		return err
	}
	attrs := []any{slog.Int64("log_entries", logEntries), slog.Int64("prune_jobs", jobs)}
	if w.core.Cfg.Retention > 0 {
		res, err := w.core.Prune(ctx, core.PruneParams{OlderThan: w.core.Cfg.Retention, Batch: w.core.Cfg.PruneBatch})
		if err != nil {
			return err
		}
		attrs = append(attrs, slog.Int64("conversations", res.Conversations), slog.Int64("turns", res.Turns),
			slog.Int64("tasks", res.Tasks), slog.Int64("skipped", res.Skipped))
	}
	w.logger.InfoContext(ctx, "arbor: pruned", attrs...)
	return nil
}
