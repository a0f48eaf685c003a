package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
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
	return engine, func() {
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			log.Print(err)
		}
		pool.Close()
	}
}

// startRunner starts a runner with the handlers; stop stops it.
func startRunner(ctx context.Context, engine *tasks.Engine, handlers map[string]machine.Handler) (stop func()) {
	runner, err := machine.NewRunner(engine, handlers, &machine.RunnerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return func() {
		if err := runner.Stop(ctx); err != nil {
			log.Print(err)
		}
	}
}

// summarize is the README's answer step: one line per child's result.
func summarize(results []arbortype.Task) (json.RawMessage, error) {
	var lines []string
	for _, r := range results {
		lines = append(lines, fmt.Sprintf("%s: %s", r.Kind, r.Result))
	}
	return json.Marshal(lines)
}

// The README's turn: it fans out to two tool calls and answers when both are
// back. The turn's handler runs twice: once to spawn and wait, and again,
// from the wait's phase, when the children have settled — also when they
// settled before the wait was written: the handler never goes on after Wait.
func ExampleRunner() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_runner")
	defer done()

	answered := make(chan int64, 1)
	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" { // runs again once both have settled
				results, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				answer, err := summarize(results)
				if err != nil {
					return err
				}
				defer func() { answered <- run.Task.ID }()
				return run.Complete(ctx, answer)
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "search"}, {Kind: "fetch"}})
			if err != nil {
				return err
			}
			// Park until both settle; the first failure aborts the other.
			return run.Wait(ctx, machine.WaitParams{ChildIDs: machine.IDs(kids), Policy: arbortype.FailFast, Phase: "gathering"})
		},
		"search": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"3 hits"`)) },
		"fetch":  func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"a page"`)) },
	})
	defer stop()

	if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-7", Kind: "turn"}); err != nil {
		log.Fatal(err)
	}
	t, err := engine.Get(ctx, <-answered)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Status, string(t.Result))
	// Output: completed ["search: \"3 hits\"", "fetch: \"a page\""]
}

// Under fail_fast the first child that fails aborts its live siblings and
// wakes the turn, which reads every outcome and decides: here it answers
// with what it has.
func ExampleRun_Wait() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_failfast")
	defer done()

	outcomes := make(chan string, 1)
	slowStarted := make(chan struct{})
	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "translating" {
				waited, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				line := ""
				for _, w := range waited {
					line += fmt.Sprintf("%s=%s ", w.Kind, w.Status)
				}
				outcomes <- line
				return run.Complete(ctx, []byte(`"partial answer"`))
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "translate_fr"}, {Kind: "translate_slow"}})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: machine.IDs(kids), Policy: arbortype.FailFast, Phase: "translating"})
		},
		"translate_fr": func(ctx context.Context, run *machine.Run) error {
			<-slowStarted // (for the example's output: a sibling that never started is "orphaned")
			return machine.NonRetryable(errors.New("the service rejected the text"))
		},
		"translate_slow": func(ctx context.Context, run *machine.Run) error {
			close(slowStarted)
			<-ctx.Done() // aborted by fail_fast: its context is cancelled
			return context.Cause(ctx)
		},
	})
	defer stop()

	if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-8", Kind: "turn"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-outcomes)
	// Output: translate_fr=failed translate_slow=aborted
}

// A tool that is rate limited sleeps and runs again from the sleep's phase
// when its time comes (a River job guarantees the wake, the runner's local
// timer makes it on time).
func ExampleRun_SleepUntil() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_sleep")
	defer done()

	phases := make(chan string, 2)
	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"weather": func(ctx context.Context, run *machine.Run) error {
			phases <- fmt.Sprintf("run in phase %q", run.Task.Phase)
			if run.Task.Phase == "backoff" {
				return run.Complete(ctx, []byte(`"sunny"`))
			}
			return run.SleepUntil(ctx, time.Now().Add(200*time.Millisecond), "backoff", []byte(`{"reason": "429"}`))
		},
	})
	defer stop()

	if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-9", Kind: "weather"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-phases)
	fmt.Println(<-phases)
	// Output:
	// run in phase ""
	// run in phase "backoff"
}
