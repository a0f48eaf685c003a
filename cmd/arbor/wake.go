package main

import (
	"context"
	"fmt"
	"io"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/tasks"
)

const wakeHelp = `Usage: arbor wake TASK [flags]

Wakes a waiting or sleeping task now: it becomes pending, and the machine
holding its conversation runs it again from its saved phase and state. A
waiting task is woken whether or not its wait is satisfied: its handler
reads its children and decides. Any other status is refused.

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
	defer engine.Pool().Close()
	t, before, err := snapshot(ctx, engine, id)
	if err != nil {
		return err
	}
	// A sleep ends through WakeNow (the user's early wake, which also removes
	// its River job); a wait has no early-wake operation of its own, so it
	// takes the operator's wake edge.
	var woken tasks.Task
	if t.Status == fsm.Sleeping {
		woken, err = engine.WakeNow(ctx, id)
	} else {
		woken, err = engine.Transition(ctx, id, fsm.Wake)
	}
	if err != nil {
		return taskErr("wake", id, err)
	}
	fmt.Fprintf(stdout, "wake #%d %s:\n", t.ID, t.Kind)
	change(stdout, before, woken)
	return otherChanges(ctx, stdout, engine, t.ConversationID, before, map[int64]bool{id: true})
}
