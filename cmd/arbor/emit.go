package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const emitHelp = `Usage: arbor emit CONVERSATION NAME [PAYLOAD] [flags]
       arbor emit --token TOKEN [PAYLOAD] [flags]

Emits an event, as the library's Emit does: NAME to the conversation (the
oldest task awaiting it takes it, or the next one to await it), or to one
task with --task. PAYLOAD is JSON (a bare word is taken as a JSON string).
By default the first emit of a name wins; --queue makes every emit a
delivery of its own. With --token, it answers exactly the await that token
names (what "arbor pending" lists): an approval. A token answers its own
await only: once that await is over (answered, timed out, woken, its task
ended or awaiting again) it is refused and nothing is emitted; posting a
token that was accepted again says so and emits nothing new.

Example:
  arbor emit chat-7 approval '{"approved": true}' --task 12
  arbor emit --token awt_3f… '{"approved": true}'
`

func cmdEmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("emit", emitHelp, stderr)
	var db dbFlags
	db.register(fs)
	token := fs.String("token", "", "answer the await this token names")
	task := fs.Int64("task", 0, "address the event to this task of the conversation")
	queue := fs.Bool("queue", false, "every emit of the name is a delivery of its own")
	key := fs.String("key", "", "idempotency key: a repeated emit with it is one emit")
	least, most := 2, 3
	for _, a := range args {
		if a == "--token" || strings.HasPrefix(a, "--token=") || a == "-token" || strings.HasPrefix(a, "-token=") {
			least, most = 0, 1
		}
	}
	pos, err := parseArgs(fs, args, least, most, "the conversation, the event's name and its payload")
	if err != nil {
		return err
	}
	if least == 0 && *token == "" {
		return fmt.Errorf("emit: --token is empty (the token an await gave: arbor pending lists them)")
	}
	var raw string
	switch {
	case *token != "" && len(pos) == 1:
		raw = pos[0]
	case *token == "" && len(pos) == 3:
		raw = pos[2]
	}
	payload, err := jsonArg(raw)
	if err != nil {
		return err
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if *token != "" {
		ev, created, err := engine.EmitToken(ctx, *token, payload)
		if err != nil {
			switch {
			case errors.Is(err, arbortype.ErrNotFound):
				return fmt.Errorf("no await has the token %s", printable(*token))
			case errors.Is(err, arbortype.ErrAwaitEnded):
				return fmt.Errorf("the await of the token %s is over (answered, timed out, or its task moved on): nothing was emitted", printable(*token))
			}
			return err
		}
		printEmitted(stdout, ev.ID, ev.Name, ev.TaskID, ev.DeliveredTo, created)
		return nil
	}
	ev, created, err := engine.Emit(ctx, tasks.EmitParams{ConversationID: pos[0], Name: pos[1], Payload: payload,
		TaskID: *task, Queue: *queue, IdempotencyKey: *key})
	if err != nil {
		if errors.Is(err, arbortype.ErrNotFound) && *task == 0 {
			return fmt.Errorf("conversation %s not found", printable(pos[0]))
		}
		return err
	}
	printEmitted(stdout, ev.ID, ev.Name, ev.TaskID, ev.DeliveredTo, created)
	return nil
}

func printEmitted(w io.Writer, id int64, name string, task, delivered int64, created bool) {
	to := "the conversation"
	if task != 0 {
		to = fmt.Sprintf("task #%d", task)
	}
	switch {
	case !created:
		fmt.Fprintf(w, "event %d %s (to %s) was emitted already: nothing new\n", id, printable(name), to)
	case delivered != 0:
		fmt.Fprintf(w, "event %d %s (to %s): delivered to #%d, which runs again\n", id, printable(name), to, delivered)
	default:
		fmt.Fprintf(w, "event %d %s (to %s): nothing awaits it yet; the next await of %s takes it\n", id, printable(name), to, printable(name))
	}
}

// jsonArg reads a payload argument: JSON, or a bare word as a JSON string;
// empty for none.
func jsonArg(s string) (json.RawMessage, error) {
	if s == "" {
		return nil, nil
	}
	if json.Valid([]byte(s)) {
		return json.RawMessage(s), nil
	}
	if strings.ContainsAny(s, "{}[]\"") {
		return nil, fmt.Errorf("the payload %s is not valid JSON", printable(s))
	}
	b, _ := json.Marshal(s)
	return b, nil
}

const pendingHelp = `Usage: arbor pending CONVERSATION [flags]

Lists what a conversation waits for from outside: every task of it, at any
depth, parked in an await, with the event's name, its timeout, and the token
that answers exactly it (arbor emit --token).

Example:
  arbor pending chat-7
`

func cmdPending(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("pending", pendingHelp, stderr)
	var db dbFlags
	db.register(fs)
	pos, err := parseArgs(fs, args, 1, 1, "the conversation")
	if err != nil {
		return err
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if _, err := requireConversation(ctx, engine, pos[0]); err != nil {
		return err
	}
	pending, err := engine.PendingEvents(ctx, pos[0])
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		fmt.Fprintf(stdout, "conversation %s awaits nothing\n", printable(pos[0]))
		return nil
	}
	for _, p := range pending {
		timeout := "no timeout"
		if p.Timeout != nil {
			timeout = "times out " + p.Timeout.UTC().Format("2006-01-02T15:04:05Z")
		}
		fmt.Fprintf(stdout, "#%d %s awaits %s (%s): token %s\n", p.TaskID, printable(p.Kind), printable(p.Name), timeout, printable(p.Token))
	}
	return nil
}
