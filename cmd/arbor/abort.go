package main

import (
	"context"
	"fmt"
	"io"
)

const abortHelp = `Usage: arbor abort TASK [flags]

Aborts a live task with every live descendant that is not background, as
the library's Abort does (one transaction; the user pressed stop): all are
settled leaves first, each owner after its children, the task itself last,
as aborted (or orphaned, for a task that never ran); then its owner is
reconciled (a waiting owner may wake). It prints each task it settled, in
that order, and whatever else changed in the conversation.

Example:
  arbor abort 42
`

func cmdAbort(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("abort", abortHelp, stderr)
	var db dbFlags
	db.register(fs)
	id, err := parseTaskArg(fs, args)
	if err != nil {
		return err
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	t, before, err := snapshot(ctx, engine, id)
	if err != nil {
		return err
	}
	rep, err := engine.Abort(ctx, id)
	if err != nil {
		return taskErr("abort", id, err)
	}
	noun := "tasks"
	if len(rep.Settled) == 1 {
		noun = "task"
	}
	fmt.Fprintf(stdout, "abort #%d %s: settled %d %s, leaves first:\n", t.ID, printable(t.Kind), len(rep.Settled), noun)
	reported := map[int64]bool{}
	for _, s := range rep.Settled {
		change(stdout, before, s)
		reported[s.ID] = true
	}
	return otherChanges(ctx, stdout, engine, t.ConversationID, before, reported)
}
