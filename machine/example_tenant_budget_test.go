package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Budgets per tenant and per window: the tenant "acme" has 1,000 tokens
// across all its conversations, and at most 100 model calls an hour (a
// rate limit: a budget with a window, reset at every whole hour UTC). A
// turn in one conversation spends 700; a turn in another wants 400, which
// does not fit, so it parks on arbor:budget; raising the tenant's budget
// lets it go on.
func ExampleRun_Reserve_tenant() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_tenant_budget")
	defer done()

	for _, p := range []tasks.BudgetParams{
		{Counter: "tokens", Max: 1000, OnExhausted: arbortype.BudgetPark},
		{Counter: "model_calls", Max: 100, Window: time.Hour, OnExhausted: arbortype.BudgetPark},
	} {
		if _, err := engine.SetTenantBudget(ctx, "acme", p); err != nil {
			log.Fatal(err)
		}
	}
	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			var want int64
			if err := json.Unmarshal(run.Task.Input, &want); err != nil {
				return machine.NonRetryable(err)
			}
			if err := run.Spend(ctx, "model_calls", 1); err != nil {
				return err // over the hour's calls: parked until the hour ends
			}
			res, err := run.Reserve(ctx, "tokens", want)
			if errors.Is(err, arbortype.ErrBudgetExhausted) {
				return err // parked: the handler runs again when the tenant's budget is raised
			}
			if err != nil {
				return err
			}
			// ... the model call ...
			if err := run.Record(ctx, res, want); err != nil {
				return err
			}
			return run.Complete(ctx, json.RawMessage(`"answered"`))
		},
	})
	defer stop()

	first, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "acme-chat-1", Tenant: "acme", Kind: "turn",
		Input: json.RawMessage(`700`)})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := engine.AwaitSettled(ctx, first.ID); err != nil {
		log.Fatal(err)
	}
	second, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "acme-chat-2", Tenant: "acme", Kind: "turn",
		Input: json.RawMessage(`400`)})
	if err != nil {
		log.Fatal(err)
	}
	pending, err := nextPending(ctx, engine, "acme-chat-2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acme-chat-2 awaits", pending[0].Name)
	if _, err := engine.SetTenantBudget(ctx, "acme", tasks.BudgetParams{Counter: "tokens", Max: 2000,
		OnExhausted: arbortype.BudgetPark}); err != nil {
		log.Fatal(err)
	}
	settled, err := engine.AwaitSettled(ctx, second.ID)
	if err != nil {
		log.Fatal(err)
	}
	budgets, err := engine.TenantBudgets(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(settled.Status, string(settled.Result))
	for _, b := range budgets {
		if b.Window == 0 {
			fmt.Printf("acme: %d of %d %s spent\n", b.Spent, b.Max, b.Counter)
		}
	}
	// Output:
	// acme-chat-2 awaits arbor:budget
	// completed "answered"
	// acme: 1100 of 2000 tokens spent
}
