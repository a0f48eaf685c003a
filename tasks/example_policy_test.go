package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/arborhq/arbor/arbortype"
)

// The message that arrives mid-turn: with the interrupt policy, the live
// turn is aborted (its subtree, leaves first, with the reason) and the new
// turn starts, in one transaction; with steer, the message goes to the live
// turn as an event instead (and is a turn of its own, queued, should the
// live turn not take it); with reject, the create fails with arbortype.ErrBusy.
func ExampleTurnPolicy() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_policy")
	defer done()

	first, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-22", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	_, _, err = engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-22", Kind: "turn", OnBusy: arbortype.TurnReject})
	fmt.Println(errors.Is(err, arbortype.ErrBusy))

	steered, created, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-22", Kind: "turn",
		OnBusy: arbortype.TurnSteer, Input: json.RawMessage(`{"text": "also in French"}`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(steered.ID == first.ID, created)

	second, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-22", Kind: "turn", OnBusy: arbortype.TurnInterrupt})
	if err != nil {
		log.Fatal(err)
	}
	was, err := engine.Get(ctx, first.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(was.Status, was.Error.Message, second.Status)
	// Output:
	// true
	// true false
	// orphaned interrupted by a new turn pending
}
