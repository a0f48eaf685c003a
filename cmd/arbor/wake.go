package main

import (
	"context"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
)

const wakeHelp = `Usage: arbor wake TASK [flags]

Wakes a sleeping task now (a sleep, or a retry's backoff), as the library's
WakeNow does: it becomes pending, its wake job is removed, and the runner
holding its conversation runs it again from its saved phase and state. Any
other status is refused: a waiting task wakes when its children satisfy its
wait (abort or cancel a child to end it sooner).

Example:
  arbor wake 42
`

func cmdWake(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("wake", wakeHelp, stderr)
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
	if t.Status != arbortype.StatusSleeping {
		return fmt.Errorf("cannot wake task %d: it is %s (wake needs a task that is %s)", id, t.Status, opNeeds["wake"])
	}
	woken, err := engine.WakeNow(ctx, id)
	if err != nil {
		return taskErr("wake", id, err)
	}
	fmt.Fprintf(stdout, "wake #%d %s:\n", t.ID, printable(t.Kind))
	change(stdout, before, woken)
	return otherChanges(ctx, stdout, engine, t.ConversationID, before, map[int64]bool{id: true})
}
