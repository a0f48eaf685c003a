package main

import (
	"context"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
)

// The steering commands (abort, cancel, wake) print what changed. An
// operation reports the tasks it acted on; what it did to others (an owner
// woken or completed, children aborted by a cancel) is found by comparing
// the conversation before and after it.

// snapshot reads the task and its conversation's tasks before an operation.
func snapshot(ctx context.Context, e *conn, id int64) (arbortype.Task, map[int64]arbortype.Task, error) {
	t, err := e.Get(ctx, id)
	if err != nil {
		return t, nil, taskErr("read", id, err)
	}
	all, err := e.ConversationTasks(ctx, t.ConversationID)
	if err != nil {
		return t, nil, fmt.Errorf("read conversation %q: %w", t.ConversationID, err)
	}
	byID := make(map[int64]arbortype.Task, len(all))
	for _, x := range all {
		byID[x.ID] = x
	}
	return t, byID, nil
}

// change writes one task's status change, "#6 browse: running → aborted".
func change(w io.Writer, before map[int64]arbortype.Task, after arbortype.Task) {
	was := "new"
	if b, ok := before[after.ID]; ok {
		was = string(b.Status)
	}
	fmt.Fprintf(w, "  #%d %s: %s → %s\n", after.ID, printable(after.Kind), printable(was), printable(string(after.Status)))
}

// otherChanges writes the status changes in the conversation since before,
// leaving out the tasks in reported. The conversation is read again after
// the operation committed, so a change another client made in between is
// listed too: the heading says so.
func otherChanges(ctx context.Context, w io.Writer, e *conn, conv string, before map[int64]arbortype.Task, reported map[int64]bool) error {
	all, err := e.ConversationTasks(ctx, conv)
	if err != nil {
		return fmt.Errorf("read conversation %q after the change: %w", conv, err)
	}
	heading := false
	for _, t := range all {
		if reported[t.ID] {
			continue
		}
		if b, ok := before[t.ID]; ok && b.Status == t.Status {
			continue
		}
		if !heading {
			fmt.Fprintln(w, "also changed in the conversation:")
			heading = true
		}
		change(w, before, t)
	}
	return nil
}
