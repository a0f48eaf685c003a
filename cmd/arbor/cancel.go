package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
)

const cancelHelp = `Usage: arbor cancel TASK [flags]

Cancels a pending, running, waiting or sleeping task, as the library's
Cancel does (one transaction): its live foreground children are aborted
first (each subtree leaves first), then the task becomes cancelled, with
--result recorded as its result, then its owner is reconciled. A completing
task cannot be cancelled: abort it. It prints the task's change and whatever
else changed in the conversation.

Example:
  arbor cancel 42
  arbor cancel 42 --result '{"reason": "operator"}'
`

func cmdCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cancel", cancelHelp, stderr)
	var db dbFlags
	db.register(fs)
	result := fs.String("result", "", "JSON recorded as the cancelled task's result (default none)")
	id, err := parseTaskArg(fs, args)
	if err != nil {
		return err
	}
	if *result != "" && !json.Valid([]byte(*result)) {
		return fmt.Errorf("cancel: --result is not valid JSON: %s", *result)
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
	cancelled, err := engine.Cancel(ctx, id, json.RawMessage(*result))
	if err != nil {
		return taskErr("cancel", id, err)
	}
	fmt.Fprintf(stdout, "cancel #%d %s:\n", t.ID, printable(t.Kind))
	change(stdout, before, cancelled)
	return otherChanges(ctx, stdout, engine, t.ConversationID, before, map[int64]bool{id: true})
}
