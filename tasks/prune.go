package tasks

import (
	"context"
	"fmt"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// PruneParams say what Prune deletes.
type PruneParams struct {
	// OlderThan is the retention of this prune: history that settled
	// longer ago than this goes (by the database's clock). Default
	// Config.Retention; one of the two is required. Any positive duration
	// is accepted: a nanosecond prunes every turn already settled (the
	// rules below still keep what is in use).
	OlderThan time.Duration
	// Batch is how many tasks one transaction deletes. Default
	// Config.PruneBatch.
	Batch int
	// DryRun counts what would be deleted and deletes nothing, by the same
	// rules (a conversation a live holder keeps is not counted deleted
	// whole); only Skipped differs, as a dry run waits for no lock.
	DryRun bool
}

// PruneResult counts what a prune deleted (with DryRun, what it would
// delete).
type PruneResult struct {
	// Conversations deleted whole (the row, its tasks and everything else
	// of it).
	Conversations int64
	// Turns deleted: root tasks with their whole subtrees.
	Turns int64
	// Tasks deleted, the turns' roots included.
	Tasks int64
	// Events, LogEntries and WakeJobs deleted with them.
	Events, LogEntries, WakeJobs int64
	// Reservations are the budget reservations of pruned tasks (their spend
	// stays counted in the conversation's budgets).
	Reservations int64
	// Skipped counts the conversations another transaction had locked
	// when the prune came to them; the next prune takes them.
	Skipped int64
}

// Prune deletes settled history older than p.OlderThan, as the runners'
// prune job does every Config.PruneInterval (docs/operations.md,
// "Retention"):
//
//   - a conversation with no live task and nothing newer than the cutoff
//     (no task created or settled, no event emitted, the conversation not
//     created after it) goes whole: its tasks, events, log, wake jobs, and
//     its row, unless a live holder has its lease (its row then goes at a
//     later prune);
//   - of every other conversation, the turns (root tasks with their
//     subtrees) whose every task settled before the cutoff go with their
//     events, log entries and wake jobs, except the conversation's newest
//     settled turn, and except any turn with a live task in it (a
//     background task still running keeps its whole turn).
//
// It never deletes a live task or a task above one; the database refuses
// that to any delete (docs/design.md §3.9). It works one conversation at a
// time, Batch tasks per transaction, each transaction taking the
// conversation's row lock first and skipping a conversation another
// transaction holds (counted in Skipped): no lock is held for long and a
// busy conversation is never waited for. Its own faults are retried per
// batch; an error after some batches committed is returned with the counts
// of what was deleted, and the next prune goes on from there. It has no
// …Tx form: it runs many transactions of its own.
func (e *Engine) Prune(ctx context.Context, p PruneParams) (PruneResult, error) {
	if p.OlderThan == 0 {
		p.OlderThan = e.core.Cfg.Retention
	}
	if p.Batch == 0 {
		p.Batch = e.core.Cfg.PruneBatch
	}
	switch {
	case p.OlderThan == 0:
		return PruneResult{}, fmt.Errorf("prune: PruneParams.OlderThan: required when Config.Retention is 0 (keep forever): %w", arbortype.ErrInvalidArgument)
	case p.OlderThan < 0:
		return PruneResult{}, fmt.Errorf("prune: PruneParams.OlderThan: %s is negative: %w", p.OlderThan, arbortype.ErrInvalidArgument)
	case p.Batch < 1 || p.Batch > 100_000:
		return PruneResult{}, fmt.Errorf("prune: PruneParams.Batch: %d is outside 1..100000: %w", p.Batch, arbortype.ErrInvalidArgument)
	}
	r, err := e.core.Prune(ctx, core.PruneParams{OlderThan: p.OlderThan, Batch: p.Batch, DryRun: p.DryRun})
	return PruneResult{
		Conversations: r.Conversations, Turns: r.Turns, Tasks: r.Tasks,
		Events: r.Rows["events"], LogEntries: r.Rows["log_entries"], WakeJobs: r.Rows["wake_jobs"],
		Reservations: r.Rows["budget_reservations"],
		Skipped:      r.Skipped,
	}, err
}
