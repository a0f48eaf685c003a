package main

import (
	"context"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const abortHelp = `Usage: arbor abort TASK [flags]
       arbor abort --conversation CONVERSATION [flags]

Aborts a live task with every live descendant that is not background, as
the library's Abort does (one transaction; the user pressed stop): all are
settled leaves first, each owner after its children, the task itself last,
as aborted (or orphaned, for a task that never ran); then its owner is
reconciled (a waiting owner may wake). With --conversation, every live task
of the conversation, background ones included (AbortConversation). --reason
is recorded as the aborted task's error (code "aborted"; on a conversation,
its live root tasks'), shown by arbor show. It prints each task it settled,
in that order, and whatever else changed in the conversation.

Example:
  arbor abort 42 --reason "the user pressed stop"
  arbor abort --conversation chat-7
`

func cmdAbort(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("abort", abortHelp, stderr)
	var db dbFlags
	db.register(fs)
	conv := fs.String("conversation", "", "abort every live task of this conversation instead of one task")
	reason := fs.String("reason", "", "why, recorded as the aborted task's error (at most 200 bytes)")
	pos, err := parseArgs(fs, args, 0, 1, "the task id")
	if err != nil {
		return err
	}
	if (*conv == "") == (len(pos) == 0) {
		return fmt.Errorf("give either a task id or --conversation (not both)")
	}
	var opts []tasks.AbortOption
	if *reason != "" {
		opts = append(opts, tasks.WithReason(*reason))
	}
	var id int64
	if *conv == "" {
		if id, err = parseTaskID(pos[0]); err != nil {
			return err
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if *conv != "" {
		return abortConversation(ctx, stdout, engine, *conv, opts)
	}
	t, before, err := snapshot(ctx, engine, id)
	if err != nil {
		return err
	}
	rep, err := engine.Abort(ctx, id, opts...)
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

func abortConversation(ctx context.Context, stdout io.Writer, engine *conn, conv string, opts []tasks.AbortOption) error {
	if _, err := requireConversation(ctx, engine, conv); err != nil {
		return err
	}
	all, err := engine.ConversationTasks(ctx, conv)
	if err != nil {
		return err
	}
	before := map[int64]arbortype.Task{}
	for _, t := range all {
		before[t.ID] = t
	}
	rep, err := engine.AbortConversation(ctx, conv, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "abort conversation %s: settled %d live tasks, leaves first:\n", printable(conv), len(rep.Settled))
	for _, s := range rep.Settled {
		change(stdout, before, s)
	}
	return nil
}
