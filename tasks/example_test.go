package tasks_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// exampleEngine migrates a schema of its own and returns an engine on it,
// and a function that drops the schema again.
func exampleEngine(ctx context.Context, schema string) (*tasks.Engine, func()) {
	pool, err := pgxpool.New(ctx, os.Getenv("ARBOR_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	return engine, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// A turn fans out to two tool calls and waits for both; the last one to
// settle wakes it.
func ExampleEngine_WaitForChildren() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_wait")
	defer done()

	turn, _, _ := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-1", Kind: "turn"})
	run, _ := engine.Start(ctx, turn.ID)
	search, _, _ := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-1", OwnerID: turn.ID, Kind: "search"})
	fetch, _, _ := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-1", OwnerID: turn.ID, Kind: "fetch"})

	res, _ := engine.WaitForChildren(ctx, turn.ID, run.Token, tasks.WaitParams{
		ChildIDs: []int64{search.ID, fetch.ID}, Policy: tasks.AllSettled, Phase: "gathering"})
	fmt.Println("turn:", res.Task.Status)

	for _, id := range []int64{search.ID, fetch.ID} {
		child, _ := engine.Start(ctx, id)
		_, _ = engine.Complete(ctx, id, child.Token, []byte(`{"ok": true}`))
	}
	woken, _ := engine.Get(ctx, turn.ID)
	fmt.Println("turn:", woken.Status, "from phase", woken.Phase)
	// Output:
	// turn: waiting
	// turn: pending from phase gathering
}

// The user presses stop: the turn and everything under it settle, leaves
// first. A task that never ran is orphaned, the others aborted.
func ExampleEngine_Abort() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_abort")
	defer done()

	turn, _, _ := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-2", Kind: "turn"})
	_, _ = engine.Start(ctx, turn.ID)
	agent, _, _ := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-2", OwnerID: turn.ID, Kind: "sub_agent"})
	_, _ = engine.Start(ctx, agent.ID)
	_, _, _ = engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-2", OwnerID: agent.ID, Kind: "browse"})

	rep, _ := engine.Abort(ctx, turn.ID)
	for _, t := range rep.Settled {
		fmt.Println(t.Kind, t.Status)
	}
	// Output:
	// browse orphaned
	// sub_agent aborted
	// turn aborted
}
