package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/arborhq/arbor/arbortype"
)

const eventsHelp = `Usage: arbor events CONVERSATION [flags]

Lists a conversation's events in the order they were emitted — every emit
by name, every answer to an await's token, every steered message — each
with its address (a task, or the conversation), whether it was queued or
first-wins, and what became of it: the task it was delivered to, or
"waiting" while no await of its name has taken it (one addressed to a task
that has settled waits for ever). --after lists the events after that id.

Example:
  arbor events chat-7
  arbor events chat-7 --json
`

func cmdEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("events", eventsHelp, stderr)
	var db dbFlags
	db.register(fs)
	after := fs.Int64("after", 0, "list the events after this id")
	asJSON := fs.Bool("json", false, `print {"conversation", "events"} as JSON`)
	pos, err := parseArgs(fs, args, 1, 1, "the conversation")
	if err != nil {
		return err
	}
	if *after < 0 {
		return fmt.Errorf("--after %d: an event id is not negative", *after)
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if _, err := requireConversation(ctx, engine, pos[0]); err != nil {
		return err
	}
	var all []arbortype.Event
	for {
		evs, err := engine.Events(ctx, pos[0], *after, 1000)
		if err != nil {
			return err
		}
		all = append(all, evs...)
		if len(evs) < 1000 {
			break
		}
		*after = evs[len(evs)-1].ID
	}
	if *asJSON {
		out := struct {
			Conversation string      `json:"conversation"`
			Events       []eventJSON `json:"events"`
		}{pos[0], make([]eventJSON, len(all))}
		for i, ev := range all {
			out.Events[i] = toEventJSON(ev)
		}
		return writeJSON(stdout, out, false)
	}
	if len(all) == 0 {
		fmt.Fprintf(stdout, "conversation %s has no events\n", printable(pos[0]))
		return nil
	}
	for _, ev := range all {
		printEvent(stdout, ev)
	}
	return nil
}

// printEvent prints one event as a line: id, name, address, policy, time,
// what became of it, payload.
func printEvent(w io.Writer, ev arbortype.Event) {
	to := "the conversation"
	if ev.TaskID != 0 {
		to = fmt.Sprintf("#%d", ev.TaskID)
	}
	policy := "first wins"
	if ev.Queued {
		policy = "queued"
	}
	fate := "waiting"
	if ev.DeliveredTo != 0 {
		fate = fmt.Sprintf("delivered to #%d", ev.DeliveredTo)
		if ev.DeliveredAt != nil {
			fate += " at " + ev.DeliveredAt.UTC().Format(eventTime)
		}
	}
	payload := "no payload"
	if len(ev.Payload) > 0 {
		payload = string(ev.Payload)
	}
	fmt.Fprintf(w, "#%d %s to %s (%s) %s: %s; %s\n", ev.ID, printable(ev.Name), to, policy,
		ev.EmittedAt.UTC().Format(eventTime), fate, printable(payload))
}

const eventTime = "2006-01-02T15:04:05.000Z"

// eventJSON is an event as --json prints it, in snake_case as in the
// database.
type eventJSON struct {
	ID             int64           `json:"id"`
	ConversationID string          `json:"conversation_id"`
	TaskID         *int64          `json:"task_id"` // null: addressed to the conversation
	Name           string          `json:"name"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	Queued         bool            `json:"queued"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	EmittedAt      jsonTime        `json:"emitted_at"`
	DeliveredTo    *int64          `json:"delivered_to"` // null while it waits
	DeliveredAt    *jsonTime       `json:"delivered_at,omitempty"`
}

func toEventJSON(ev arbortype.Event) eventJSON {
	j := eventJSON{ID: ev.ID, ConversationID: ev.ConversationID, Name: ev.Name, Payload: ev.Payload, Queued: ev.Queued,
		IdempotencyKey: ev.IdempotencyKey, EmittedAt: jsonTime(ev.EmittedAt), DeliveredAt: (*jsonTime)(ev.DeliveredAt)}
	if ev.TaskID != 0 {
		j.TaskID = &ev.TaskID
	}
	if ev.DeliveredTo != 0 {
		j.DeliveredTo = &ev.DeliveredTo
	}
	return j
}
