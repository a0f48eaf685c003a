package machine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// A runner runs a turn that fans out to two tool calls and answers when
// both are back. The turn's handler runs twice: once to spawn and wait, and
// again, from its saved phase, when the last child settles.
func ExampleRunner() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("ARBOR_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	const schema = "arbor_example_runner"
	m, _ := migrations.New(pool, schema, nil)
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	runner, err := machine.NewRunner(engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				results, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				return run.Complete(ctx, json.RawMessage(fmt.Sprintf(`{"sources": %d}`, len(results))))
			}
			var ids []int64
			for _, kind := range []string{"search", "fetch"} {
				child, err := run.Spawn(ctx, machine.SpawnParams{Kind: kind})
				if err != nil {
					return err
				}
				ids = append(ids, child.ID)
			}
			_, err := run.Wait(ctx, ids, tasks.AllSettled, "gathering", nil)
			return err
		},
		"search": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"hits"`)) },
		"fetch":  func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"page"`)) },
	}, &machine.RunnerConfig{PollInterval: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer runner.Stop(ctx) //nolint:errcheck

	turn, _, err := engine.Create(ctx, tasks.CreateParams{ConversationID: "chat-7", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	for {
		t, _ := engine.Get(ctx, turn.ID)
		if t.Status == fsm.Completed {
			fmt.Println(t.Status, string(t.Result))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Output: completed {"sources": 2}
}
