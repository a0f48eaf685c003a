package tasks_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// Three turns of a chat: the two settled ones and a live one. Pruning
// keeps the conversation usable: the older settled turn goes, the newest
// settled turn (the context of the live one) and the live turn stay. A dry
// run first says what would go. (OlderThan a nanosecond prunes everything
// already settled; a backend sets Config.Retention, such as 30 days, and
// lets the runners prune.)
func ExampleEngine_Prune() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_prune")
	defer done()

	var ids []int64
	for i := range 3 {
		turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn"})
		if err != nil {
			log.Fatal(err)
		}
		if i < 2 { // settled (a runner would complete them)
			if _, err := engine.Cancel(ctx, turn.ID, nil); err != nil {
				log.Fatal(err)
			}
		}
		ids = append(ids, turn.ID)
	}
	dry, err := engine.Prune(ctx, tasks.PruneParams{OlderThan: time.Nanosecond, DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("would prune %d turn(s), %d task(s)\n", dry.Turns, dry.Tasks)
	res, err := engine.Prune(ctx, tasks.PruneParams{OlderThan: time.Nanosecond})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pruned %d turn(s), %d task(s)\n", res.Turns, res.Tasks)
	left, err := engine.ConversationTasks(ctx, "chat-1")
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range left {
		fmt.Println(t.ID == ids[1], t.ID == ids[2], t.Status)
	}
	// Output:
	// would prune 1 turn(s), 1 task(s)
	// pruned 1 turn(s), 1 task(s)
	// true false cancelled
	// false true pending
}

// Edit and regenerate: the user edits their second message. The backend
// forks the conversation through the first turn and starts the edited
// turn in the copy; the original conversation is untouched.
func ExampleEngine_Fork() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_fork")
	defer done()

	var turns []int64
	for _, msg := range []string{`"hello"`, `"what is arbor?"`} {
		turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn", Input: []byte(`{"message": ` + msg + `}`)})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := engine.Cancel(ctx, turn.ID, []byte(`"an answer"`)); err != nil { // a runner would complete it
			log.Fatal(err)
		}
		turns = append(turns, turn.ID)
	}
	f, err := engine.Fork(ctx, tasks.ForkParams{ConversationID: "chat-1", ThroughTurn: turns[0], NewConversationID: "chat-1-edit"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(f.ConversationID, f.Tasks)
	edited, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: f.ConversationID, Kind: "turn",
		Input: []byte(`{"message": "what is arbor, in one line?"}`)})
	if err != nil {
		log.Fatal(err)
	}
	copyTasks, err := engine.ConversationTasks(ctx, f.ConversationID)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range copyTasks {
		fmt.Println(t.Kind, string(t.Input), t.Status, t.ID == edited.ID)
	}
	if _, err := engine.Abort(ctx, edited.ID); err != nil {
		log.Fatal(err)
	}
	vs, err := engine.Check(ctx, "chat-1", f.ConversationID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("violations:", len(vs))
	// Output:
	// chat-1-edit 1
	// turn {"message": "hello"} cancelled false
	// turn {"message": "what is arbor, in one line?"} pending true
	// violations: 0
}
