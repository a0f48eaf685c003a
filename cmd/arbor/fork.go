package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const forkHelp = `Usage: arbor fork CONVERSATION TURN [flags]

Copies the conversation's settled history, up to and including the turn TURN
(a settled root task of it), into a new conversation, and prints the new
conversation's id: every settled turn up to it with its subtree, the events
of those tasks and the log up to that point, with new ids. The original is
not written. Create a new turn in the copy to "edit and regenerate".

Example:
  arbor fork chat-42 17
  arbor fork chat-42 17 --new chat-42-edit
`

func cmdFork(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fork", forkHelp, stderr)
	var db dbFlags
	db.register(fs)
	newID := fs.String("new", "", "the new conversation's id (default: a fresh fork_… id)")
	pos, err := parseArgs(fs, args, 2, 2, "the conversation and the turn")
	if err != nil {
		return err
	}
	turn, err := parseTaskID(pos[1])
	if err != nil {
		return err
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	f, err := engine.Fork(ctx, tasks.ForkParams{ConversationID: pos[0], ThroughTurn: turn, NewConversationID: *newID})
	switch {
	case errors.Is(err, arbortype.ErrNotSettled):
		return fmt.Errorf("fork: turn %d is still live: fork through a settled turn", turn)
	case errors.Is(err, arbortype.ErrNotRoot):
		return fmt.Errorf("fork: task %d is not a turn (a root task): fork through its turn", turn)
	case err != nil:
		return fmt.Errorf("fork: %w", err)
	}
	fmt.Fprintf(stdout, "forked %s through turn #%d into %s: %d tasks, %d events, %d log entries\n",
		printable(pos[0]), turn, printable(f.ConversationID), f.Tasks, f.Events, f.LogEntries)
	return nil
}
