package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// exampleEngine migrates a schema of its own and returns an engine on it,
// its pool, and a function that drops the schema again.
func exampleEngine(ctx context.Context, schema string) (*tasks.Engine, *pgxpool.Pool, func()) {
	pool, err := pgxpool.New(ctx, os.Getenv("ARBOR_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// A schema of the example's own, fresh: one an interrupted run left
	// behind is dropped first.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
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
	return engine, pool, func() {
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			log.Print(err)
		}
		pool.Close()
	}
}

// A user's message starts a turn. The idempotency key makes a retried
// request (the client resent it) return the same turn instead of a second.
func ExampleEngine_Create() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_create")
	defer done()

	p := arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn",
		Input: []byte(`{"message": "what is arbor?"}`), IdempotencyKey: "msg-17"}
	turn, created, err := engine.Create(ctx, p)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(turn.Kind, turn.Status, created)

	again, created, err := engine.Create(ctx, p)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.ID == turn.ID, created)

	// Bad input is refused, and nothing is written.
	_, _, err = engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn", Input: []byte(`{oops`)})
	fmt.Println(errors.Is(err, arbortype.ErrInvalidJSON))
	// Output:
	// turn pending true
	// true false
	// true
}

// The turn commits together with the application's own row: both exist, or
// neither does.
func ExampleEngine_CreateTx() {
	ctx := context.Background()
	engine, pool, done := exampleEngine(ctx, "arbor_example_createtx")
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE arbor_example_createtx.messages (id bigserial PRIMARY KEY, body text, turn_id bigint)`); err != nil {
		log.Fatal(err)
	}

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		turn, _, err := engine.CreateTx(ctx, tx, arbortype.CreateParams{ConversationID: "chat-2", Kind: "turn"})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO arbor_example_createtx.messages (body, turn_id) VALUES ($1, $2)`, "hello", turn.ID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	var body string
	var status arbortype.Status
	err = pool.QueryRow(ctx, `SELECT m.body, t.status FROM arbor_example_createtx.messages m
		JOIN arbor_example_createtx.tasks t ON t.id = m.turn_id`).Scan(&body, &status)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(body, status)
	// Output: hello pending
}

// The user presses stop: the turn and everything under it settle, leaves
// first. A task that never ran is orphaned, the others aborted.
func ExampleEngine_Abort() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_abort")
	defer done()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-3", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	for _, kind := range []string{"search", "sub_agent"} {
		if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-3", OwnerID: turn.ID, Kind: kind}); err != nil {
			log.Fatal(err)
		}
	}

	rep, err := engine.Abort(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range rep.Settled {
		fmt.Println(t.Kind, t.Status)
	}
	_, err = engine.Abort(ctx, turn.ID)
	fmt.Println(errors.Is(err, arbortype.ErrInvalidTransition))
	// Output:
	// sub_agent orphaned
	// search orphaned
	// turn orphaned
	// true
}

// Cancel ends one task with a result of its own choosing; its foreground
// children are aborted first, and a background child is left running.
func ExampleEngine_Cancel() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_cancel")
	defer done()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-4", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	tool, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-4", OwnerID: turn.ID, Kind: "tool"})
	if err != nil {
		log.Fatal(err)
	}
	summary, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-4", OwnerID: turn.ID, Kind: "summary", Background: true})
	if err != nil {
		log.Fatal(err)
	}
	cancelled, err := engine.Cancel(ctx, turn.ID, []byte(`{"reason": "superseded"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cancelled.Status, string(cancelled.Result))
	for _, id := range []int64{tool.ID, summary.ID} {
		t, err := engine.Get(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(t.Kind, t.Status)
	}
	// Output:
	// cancelled {"reason": "superseded"}
	// tool orphaned
	// summary pending
}

// The invariant checker reads a conversation in one snapshot and lists every
// breach of the invariants of docs/design.md §4; a healthy one has none.
func ExampleEngine_Check() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_check")
	defer done()

	if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-5", Kind: "turn"}); err != nil {
		log.Fatal(err)
	}
	vs, err := engine.Check(ctx, "chat-5")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(vs), "violations")
	_, err = engine.Check(ctx, "no-such-chat")
	fmt.Println(errors.Is(err, arbortype.ErrNotFound))
	// Output:
	// 0 violations
	// true
}

// ListConversations is what `arbor ls` shows: every conversation with live
// work, its lease holder, and its live tasks by status.
func ExampleEngine_ListConversations() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_list")
	defer done()

	for _, conv := range []string{"chat-a", "chat-b", "chat-b"} {
		if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"}); err != nil {
			log.Fatal(err)
		}
	}
	list, err := engine.ListConversations(ctx, tasks.ListParams{})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range list {
		fmt.Printf("%s pending=%d holder=%q\n", c.ID, c.Live[arbortype.StatusPending], c.Holder)
	}
	// Output:
	// chat-a pending=1 holder=""
	// chat-b pending=2 holder=""
}
