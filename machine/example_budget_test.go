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

// A budget across the tree: the session has 1,000 tokens and parks when
// they run out; each model call reserves its most and records what it
// used. The third call does not fit, so the turn parks on arbor:budget;
// raising the session's budget lets it go on.
func ExampleRun_Reserve() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_budget")
	defer done()

	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			var calls int // the model calls made so far: the last checkpoint's state
			if len(run.Task.State) > 0 {
				if err := json.Unmarshal(run.Task.State, &calls); err != nil {
					return machine.NonRetryable(err)
				}
			}
			for ; calls < 3; calls++ {
				res, err := run.Reserve(ctx, "tokens", 400) // the call's most
				if errors.Is(err, arbortype.ErrBudgetExhausted) {
					return err // parked: the handler runs again when a budget is raised
				}
				if err != nil {
					return err
				}
				// ... the model call, which used 350 tokens ...
				if err := run.Record(ctx, res, 350); err != nil {
					return err
				}
				state, err := json.Marshal(calls + 1)
				if err != nil {
					return err
				}
				if err := run.Checkpoint(ctx, "calling", state); err != nil {
					return err
				}
			}
			return run.Complete(ctx, json.RawMessage(`"answered"`))
		},
	})
	defer stop()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-30", Kind: "turn",
		ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000, OnExhausted: arbortype.BudgetPark}}})
	if err != nil {
		log.Fatal(err)
	}
	pending, err := nextPending(ctx, engine, "chat-30") // the turn parked on arbor:budget
	if err != nil {
		log.Fatal(err)
	}
	b, err := engine.Budget(ctx, "chat-30", 0, "tokens") // the session's budget
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("awaiting %s: %d of %d tokens spent\n", pending[0].Name, b.Spent, b.Max)
	if _, err := engine.SetBudget(ctx, tasks.BudgetParams{ConversationID: "chat-30", Counter: "tokens", Max: 2000,
		OnExhausted: arbortype.BudgetPark}); err != nil {
		log.Fatal(err)
	}
	settled, err := engine.AwaitSettled(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	if b, err = engine.Budget(ctx, "chat-30", 0, "tokens"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(settled.Status, string(settled.Result), b.Spent, "tokens spent")
	// Output:
	// awaiting arbor:budget: 700 of 1000 tokens spent
	// completed "answered" 1050 tokens spent
}
