package main

import (
	"context"
	"fmt"
	"io"

	"github.com/arborhq/arbor/tasks"
)

const checkHelp = `Usage: arbor check [CONVERSATION] [flags]

Runs the invariant checker (docs/design.md §4) over one conversation, or over every
conversation of the schema when none is given, and lists each violation:
the invariant's number, the conversation, the task and what is wrong.

Exit status: 0 and "no violations" when there are none; 1 when it found
violations; 2 when it could not check (no database, an unknown
conversation…), so that a monitor can tell a broken tree from a broken
check.

Example:
  arbor check
  arbor check chat-42
`

func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check", checkHelp, stderr)
	var db dbFlags
	db.register(fs)
	pos, err := parseArgs(fs, args, 0, 1, "")
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	vs, scope, err := runCheck(ctx, db, pos)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if len(vs) == 0 {
		fmt.Fprintf(stdout, "no violations (%s)\n", printable(scope))
		return nil
	}
	for _, v := range vs {
		fmt.Fprintln(stdout, printable(v.String()))
	}
	return &exitError{code: 1, err: fmt.Errorf("check: %d invariant violations (%s)", len(vs), scope)}
}

// runCheck returns the violations and what was checked, in words.
func runCheck(ctx context.Context, db dbFlags, pos []string) ([]tasks.Violation, string, error) {
	engine, err := db.engine(ctx)
	if err != nil {
		return nil, "", err
	}
	defer engine.Close()
	if len(pos) == 1 {
		if _, err := requireConversation(ctx, engine, pos[0]); err != nil {
			return nil, "", err
		}
		vs, err := engine.Check(ctx, pos[0])
		return vs, fmt.Sprintf("conversation %s", pos[0]), err
	}
	vs, err := engine.Check(ctx)
	return vs, fmt.Sprintf("every conversation of schema %s", db.schema), err
}
