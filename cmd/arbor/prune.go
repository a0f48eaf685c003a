package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/arborhq/arbor/tasks"
)

const pruneHelp = `Usage: arbor prune --older-than DURATION [flags]

Deletes settled history older than DURATION, as the runners' prune job does
with tasks.Config.Retention: conversations with nothing live and nothing
newer than the cutoff go whole; of the others, the turns (root tasks with
their subtrees) that settled before it go with their events, log entries and
wake jobs, except each conversation's newest settled turn and any turn with
a live task. A live task, or anything a live task reads, is never deleted
(the database refuses it). It works in small transactions, skipping a
conversation another transaction holds; run it again to take those.

--dry-run prints what it would delete and deletes nothing.

Example:
  arbor prune --older-than 720h --dry-run
  arbor prune --older-than 720h --batch 200
`

func cmdPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prune", pruneHelp, stderr)
	var db dbFlags
	db.register(fs)
	olderThan := fs.Duration("older-than", 0, "delete settled history older than this (required; such as 720h)")
	batch := fs.Int("batch", tasks.PruneBatchDefault, "tasks deleted per transaction")
	dry := fs.Bool("dry-run", false, "print what would be deleted, delete nothing")
	if _, err := parseArgs(fs, args, 0, 0, ""); err != nil {
		return err
	}
	if *olderThan <= 0 {
		return fmt.Errorf("prune: --older-than is required and must be positive (such as 720h for 30 days)")
	}
	if *batch < 1 {
		return fmt.Errorf("prune: --batch %d: must be at least 1", *batch)
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	res, err := engine.Prune(ctx, tasks.PruneParams{OlderThan: *olderThan, Batch: *batch, DryRun: *dry})
	if err != nil && (*dry || res == (tasks.PruneResult{})) {
		return fmt.Errorf("prune: %w (nothing was deleted)", err)
	}
	verb := "pruned"
	if *dry {
		verb = "would prune"
	}
	fmt.Fprintf(stdout, "%s (settled before %s ago): %d conversations whole, %d turns, %d tasks, %d events, %d log entries, %d wake jobs\n",
		verb, olderThan.Round(time.Second), res.Conversations, res.Turns, res.Tasks, res.Events, res.LogEntries, res.WakeJobs)
	if res.Reservations > 0 {
		fmt.Fprintf(stdout, "and %d budget reservations (their spend stays counted in the conversations' budgets)\n", res.Reservations)
	}
	if res.Skipped > 0 {
		fmt.Fprintf(stdout, "skipped %d conversations held by another transaction: run it again to take them\n", res.Skipped)
	}
	if err != nil {
		return fmt.Errorf("prune: %w (what is counted above was deleted)", err)
	}
	return nil
}
