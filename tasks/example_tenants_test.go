package tasks_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// Many tenants on one database: each conversation belongs to a tenant (set
// by the create that makes it, never changed). Under contention the runners
// share their workers among tenants by weight, and within a tenant take
// work in queue order: an interactive turn of priority 60 goes before a
// background backlog up to a minute old.
func ExampleEngine_SetTenantWeight() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_tenants")
	defer done()

	// A paying customer's share is three times the free tier's.
	if err := engine.SetTenantWeight(ctx, "acme", 3); err != nil {
		log.Fatal(err)
	}
	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "acme/chat-1", Kind: "chat_turn",
		Tenant: "acme", Priority: 60})
	if err != nil {
		log.Fatal(err)
	}
	summary, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "acme/chat-1", Kind: "summarize",
		Priority: -60}) // names no tenant: the conversation's
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(turn.Tenant, turn.Priority, summary.Tenant, summary.Priority)

	// A conversation's tenant never changes.
	_, _, err = engine.Create(ctx, arbortype.CreateParams{ConversationID: "acme/chat-1", Kind: "chat_turn", Tenant: "globex"})
	fmt.Println(err != nil)

	tenants, err := engine.Tenants(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tenants {
		fmt.Println(t.Name, t.Weight)
	}
	// Output:
	// acme 60 acme -60
	// true
	// acme 3
}

// Concurrency limits: at most 50 calls of the search tool at once across
// every node, and at most 20 running tasks of the tenant acme. A task names
// its tool's key at create (or spawn); a start takes a slot of every limit
// of its keys, and the end of its run gives them back.
func ExampleEngine_SetConcurrencyLimit() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_limits")
	defer done()

	if err := engine.SetConcurrencyLimit(ctx, "key:search", 50); err != nil {
		log.Fatal(err)
	}
	if err := engine.SetConcurrencyLimit(ctx, "tenant:acme", 20); err != nil {
		log.Fatal(err)
	}
	_, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-9", Kind: "web_search",
		Tenant: "acme", ConcurrencyKey: "search"})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := engine.ConcurrencyLimits(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range limits {
		fmt.Printf("%s %d/%d\n", l.Key, l.Running, l.Max)
	}
	// Output:
	// key:search 0/50
	// tenant:acme 0/20
}

// A turn queued behind a live one may carry a time to live: not started
// by then, it is cancelled with code "expired" and never starts.
func ExampleEngine_Create_queueTTL() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_queue_ttl")
	defer done()

	if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-3", Kind: "chat_turn"}); err != nil {
		log.Fatal(err)
	}
	queued, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-3", Kind: "chat_turn",
		QueueTTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(queued.Status, queued.QueueExpiresAt.Sub(queued.CreatedAt))
	// Output:
	// pending 30s
}
