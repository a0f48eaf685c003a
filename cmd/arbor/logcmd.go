package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const logHelp = `Usage: arbor log CONVERSATION [flags]

Prints a conversation's log — every status change of every task (a
settle with its error's code and message: an abort's reason), the
handlers' progress and the events, in commit order — after --after (a
seq), and with --follow keeps printing new entries as they commit, until
interrupted (or, with --until-settled TASK, until that task settles).

Example:
  arbor log chat-7 --follow
`

func cmdLog(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("log", logHelp, stderr)
	var db dbFlags
	db.register(fs)
	after := fs.Int64("after", 0, "print the entries after this seq")
	follow := fs.Bool("follow", false, "keep printing new entries as they commit")
	until := fs.Int64("until-settled", 0, "with --follow, stop once this task has settled")
	pos, err := parseArgs(fs, args, 1, 1, "the conversation")
	if err != nil {
		return err
	}
	switch {
	case *until < 0:
		return fmt.Errorf("log: --until-settled %d: a task id is positive", *until)
	case *until != 0 && !*follow:
		return fmt.Errorf("log: --until-settled goes with --follow")
	case *after < 0:
		return fmt.Errorf("log: --after %d: a seq is not negative", *after)
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if _, err := requireConversation(ctx, engine, pos[0]); err != nil {
		return err
	}
	if *until != 0 {
		// A task the conversation does not have would never settle in its
		// log; one settled already is followed up to now, then done.
		t, err := engine.Get(ctx, *until)
		switch {
		case errors.Is(err, arbortype.ErrNotFound) || (err == nil && t.ConversationID != pos[0]):
			return fmt.Errorf("log: --until-settled %d: no such task in conversation %s", *until, printable(pos[0]))
		case err != nil:
			return err
		case t.Status.Settled():
			*follow = false
		}
	}
	if !*follow {
		for {
			entries, err := engine.ReadLog(ctx, pos[0], *after, 1000)
			if err != nil {
				return err
			}
			for _, en := range entries {
				printEntry(stdout, en)
				*after = en.Seq
			}
			if len(entries) < 1000 {
				return nil
			}
		}
	}
	stop := errors.New("settled")
	err = engine.Follow(ctx, pos[0], *after, func(en arbortype.LogEntry) error {
		printEntry(stdout, en)
		if *until == 0 {
			return nil
		}
		settled, err := settles(ctx, engine.Engine, *until, en)
		if err == nil && settled {
			err = stop
		}
		return err
	})
	if errors.Is(err, stop) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// settles reports whether en is the settle of task id. The entry is
// written by the statement that settles the task, so one whose task is
// not settled was written past the log's INSERT guard, with the triggers
// off (arbor check reports it): a follow goes on until the task really
// settles.
func settles(ctx context.Context, engine *tasks.Engine, id int64, en arbortype.LogEntry) (bool, error) {
	if en.TaskID != id || !en.Terminal() {
		return false, nil
	}
	t, err := engine.Get(ctx, id)
	if err != nil {
		return false, err
	}
	return t.Status.Settled(), nil
}

// errorText is a settle's error as a line says it: "code: message", or
// the one of the two it has.
func errorText(te *arbortype.TaskError) string {
	switch {
	case te.Code == "":
		return te.Message
	case te.Message == "":
		return te.Code
	}
	return te.Code + ": " + te.Message
}

func printEntry(w io.Writer, en arbortype.LogEntry) {
	at := en.At.UTC().Format("15:04:05.000")
	switch en.Kind {
	case arbortype.LogKindStatus:
		why := ""
		if te := en.SettleError(); te != nil {
			why = " (" + printable(errorText(te)) + ")"
		}
		fmt.Fprintf(w, "%d %s #%d %s %s%s\n", en.Seq, at, en.TaskID, printable(en.Name), printable(string(en.Status)), why)
	case arbortype.LogKindProgress:
		fmt.Fprintf(w, "%d %s #%d progress %s %s\n", en.Seq, at, en.TaskID, printable(en.Name), printable(string(en.Payload)))
	default:
		fmt.Fprintf(w, "%d %s event %s %s\n", en.Seq, at, printable(en.Name), printable(string(en.Payload)))
	}
}
