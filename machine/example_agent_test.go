package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// A human approval: the handler parks on the event "approval"; the
// conversation's pending events list it with a token; the client posts the
// user's answer back with that token (EmitToken, or arbor emit --token);
// the handler runs again with the answer. From outside, AwaitSettled
// returns the turn's result once it has committed.
func ExampleRun_AwaitEvent() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_approval")
	defer done()

	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"refund": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "decided" {
				var answer struct {
					Approved bool `json:"approved"`
				}
				if err := json.Unmarshal(run.Task.Delivered.Payload, &answer); err != nil {
					return machine.NonRetryable(err)
				}
				return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"refunded": %t}`, answer.Approved)))
			}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Phase: "decided"})
		},
	})
	defer stop()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-20", Kind: "refund"})
	if err != nil {
		log.Fatal(err)
	}
	// The UI learns that the conversation waits for an answer, and shows
	// the request.
	pending, err := nextPending(ctx, engine, "chat-20")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("awaiting:", pending[0].Name)
	// The user clicks "approve" (twice: the token makes it one answer).
	for range 2 {
		if _, _, err := engine.EmitToken(ctx, pending[0].Token, json.RawMessage(`{"approved": true}`)); err != nil {
			log.Fatal(err)
		}
	}
	settled, err := engine.AwaitSettled(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(settled.Status, string(settled.Result))
	// Output:
	// awaiting: approval
	// completed {"refunded": true}
}

var errSeen = errors.New("seen")

// nextPending follows a conversation's log until one of its tasks is parked
// in an await, and returns what the conversation awaits (PendingEvents):
// how a UI hears that it has a question to show, without polling.
func nextPending(ctx context.Context, engine *tasks.Engine, conv string) ([]arbortype.PendingEvent, error) {
	var pending []arbortype.PendingEvent
	err := engine.Follow(ctx, conv, 0, func(en arbortype.LogEntry) error {
		if en.Kind != arbortype.LogKindStatus || en.Status != arbortype.StatusSleeping {
			return nil
		}
		var err error
		if pending, err = engine.PendingEvents(ctx, conv); err != nil {
			return err
		}
		if len(pending) > 0 {
			return errSeen
		}
		return nil
	})
	if errors.Is(err, errSeen) {
		return pending, nil
	}
	return nil, err
}

// A client follows a conversation: every status change of every task and
// the handler's progress, in commit order, live. A client that reconnects
// passes the Seq of the last entry it saw and misses nothing.
func ExampleRun_Progress() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_stream")
	defer done()

	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"answer": func(ctx context.Context, run *machine.Run) error {
			for _, tok := range []string{`"Hello"`, `", "`, `"world"`} {
				if err := run.Progress(ctx, "token", json.RawMessage(tok)); err != nil {
					return err
				}
			}
			return run.Complete(ctx, nil)
		},
	})
	defer stop()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-21", Kind: "answer"})
	if err != nil {
		log.Fatal(err)
	}
	err = engine.Follow(ctx, "chat-21", 0, func(en arbortype.LogEntry) error {
		switch en.Kind {
		case arbortype.LogKindProgress:
			fmt.Println("token", string(en.Payload))
		case arbortype.LogKindStatus:
			// A turn its create started is never pending; one a runner
			// claimed was first (docs/design.md §3.18).
			if en.Status != arbortype.StatusPending {
				fmt.Println(en.Name, en.Status)
			}
		}
		if en.TaskID == turn.ID && en.Terminal() {
			return errSeen
		}
		return nil
	})
	fmt.Println(errors.Is(err, errSeen))
	// Output:
	// answer running
	// token "Hello"
	// token ", "
	// token "world"
	// answer completed
	// true
}
