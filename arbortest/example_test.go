package arbortest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// chatTurn is the handler under test: a turn that calls a weather tool,
// then answers from the tool's result once the call has settled.
func chatTurn(ctx context.Context, run *machine.Run) error {
	if run.Task.Phase == "answer" {
		calls, err := run.Waited(ctx)
		if err != nil {
			return err
		}
		if calls[0].Status != arbortype.StatusCompleted {
			return run.Complete(ctx, json.RawMessage(`"the weather tool is down"`))
		}
		var forecast string
		if err := json.Unmarshal(calls[0].Result, &forecast); err != nil {
			return machine.NonRetryable(err)
		}
		answer, err := json.Marshal("It will be " + forecast + ".")
		if err != nil {
			return err
		}
		return run.Complete(ctx, answer)
	}
	call, err := run.Spawn(ctx, machine.SpawnParams{Kind: "weather", Input: run.Task.Input})
	if err != nil {
		return err
	}
	return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{call.ID}, Policy: arbortype.AllSettled, Phase: "answer"})
}

func weather(ctx context.Context, run *machine.Run) error {
	return run.Complete(ctx, json.RawMessage(`"sunny"`))
}

// A chat turn's handler tested without a Runner: the turn spawns a tool
// call and waits; the tool call is worked with its own handler, which wakes
// the turn; the turn runs again and answers. In a test, t is the test's
// *testing.T (an Example has none: exampleT stands in for it).
func Example_chatTurn() {
	ctx := context.Background()
	t := &exampleT{}
	defer t.cleanup() // drops the schema, then closes the pool

	pool, schema := arbortest.Database(t) // a pool on $ARBOR_DATABASE_URL, a migrated schema of the test's own
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn", Input: json.RawMessage(`"Paris"`)})
	if err != nil {
		log.Fatal(err)
	}

	res := arbortest.Work(ctx, t, engine, chatTurn, turn.ID)
	fmt.Println("turn:", res.Outcome, "spawned", res.Spawned[0].Kind, string(res.Spawned[0].Input))

	res = arbortest.Work(ctx, t, engine, weather, res.Spawned[0].ID)
	fmt.Println("tool call:", res.Outcome, string(res.Task.Result))

	woken := arbortest.RequireStatus(ctx, t, engine, turn.ID, arbortype.StatusPending)
	fmt.Println("turn woken into phase", woken.Phase)

	res = arbortest.Work(ctx, t, engine, chatTurn, turn.ID)
	fmt.Println("turn:", res.Outcome)
	arbortest.RequireSettled(ctx, t, engine, turn.ID, arbortype.StatusCompleted, json.RawMessage(`"It will be sunny."`))
	arbortest.RequireConsistent(ctx, t, engine, "chat-1")
	// Output:
	// turn: waiting spawned weather "Paris"
	// tool call: completed "sunny"
	// turn woken into phase answer
	// turn: completed
}

// A handler's error is the task's failure, retried under its policy: Work
// reports it, and the error the task records.
func ExampleWork_retried() {
	ctx := context.Background()
	t := &exampleT{}
	defer t.cleanup() // drops the schema, then closes the pool

	pool, _ := arbortest.Database(t)
	engine := arbortest.Engine(t, pool, nil) // an engine on a migrated schema of the test's own
	call, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-2", Kind: "weather", MaxRetries: 3})
	if err != nil {
		log.Fatal(err)
	}
	res := arbortest.Work(ctx, t, engine, func(ctx context.Context, run *machine.Run) error {
		return fmt.Errorf("weather service: 503")
	}, call.ID)
	fmt.Println(res.Outcome, res.Task.Status, res.Task.Retries, res.Task.Error.Message)
	// Output:
	// retried sleeping 1 weather service: 503
}

// exampleT stands in for a test's *testing.T in the examples: failures
// stop the example, cleanups run when it ends.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (*exampleT) Helper() {}

func (*exampleT) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }

func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *exampleT) cleanup() {
	for _, f := range slices.Backward(t.cleanups) {
		f()
	}
}

// The test docs/agents.md shows ("Testing your handlers").
func TestTurnAnswersFromTheWeatherTool(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := arbortest.Database(t) // a pool on $ARBOR_DATABASE_URL, a migrated schema of this test's own; gone when it ends
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-1", Kind: "turn", Input: json.RawMessage(`"Paris"`)})
	require.NoError(t, err)

	res := arbortest.Work(ctx, t, engine, chatTurn, turn.ID) // spawns the tool call and waits
	require.Equal(t, arbortest.WorkWaiting, res.Outcome)
	calls := arbortest.RequireChildren(ctx, t, engine, turn.ID, "weather", 1)

	arbortest.Work(ctx, t, engine, weather, calls[0].ID) // completes; the turn wakes in the same transaction
	arbortest.Work(ctx, t, engine, chatTurn, turn.ID)    // runs again from phase "answer"
	arbortest.RequireSettled(ctx, t, engine, turn.ID, arbortype.StatusCompleted, json.RawMessage(`"It will be sunny."`))
}
