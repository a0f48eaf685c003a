package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
)

const rerunHelp = `Usage: arbor rerun TASK [flags]

Runs a failed, aborted or cancelled task again from its last checkpoint, as
the library's Rerun does: a new pending task of the same kind, input and
owner, carrying the failed task's phase and state, which a runner picks up
like any other. The failed task stays as it is; the new one names it
("rerun of #TASK" in show and tree). When the task's parent still waits on
it, the rerun takes its place in that wait. A task is rerun once: to try
again, rerun the rerun. A task whose parent has settled is refused (rerun
the parent, or the turn).

Example:
  arbor rerun 42
`

func cmdRerun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rerun", rerunHelp, stderr)
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
	rerun, err := engine.Rerun(ctx, id)
	switch {
	case errors.Is(err, arbortype.ErrNotSettled), errors.Is(err, arbortype.ErrInvalidTransition) && (t.Status == arbortype.StatusCompleted || t.Status == arbortype.StatusOrphaned):
		return fmt.Errorf("cannot rerun task %d: it is %s (rerun needs a task that is %s)", id, t.Status, opNeeds["rerun"])
	case err != nil:
		return taskErr("rerun", id, err)
	}
	fmt.Fprintf(stdout, "rerun #%d %s as #%d, from phase %q:\n", t.ID, printable(t.Kind), rerun.ID, printable(rerun.Phase))
	change(stdout, before, rerun)
	return otherChanges(ctx, stdout, engine, t.ConversationID, before, map[int64]bool{rerun.ID: true})
}
