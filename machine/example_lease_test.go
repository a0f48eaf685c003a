package machine_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// Code that runs tasks itself, without a Runner, holds the conversation's
// lease: no Runner touches the conversation meanwhile. When such a holder
// dies, the next one to take the lease — once it has expired — recovers its
// running tasks: back to pending with attempt + 1, the checkpoint kept.
func ExampleAcquireLease() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_lease")
	defer done()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-10", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	// A short lease, so that the example need not wait long for it to
	// expire. What worker-1 does under it is fenced by the lease's epoch,
	// which only a take-over moves: it does not race the expiry.
	first, err := machine.AcquireLease(ctx, engine, "chat-10", &machine.LeaseConfig{Holder: "worker-1", Duration: 200 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	run, err := first.Start(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	if err := run.Checkpoint(ctx, "half-way", []byte(`{"page": 3}`)); err != nil {
		log.Fatal(err)
	}
	// worker-1 dies here: it never renews nor releases. Until its lease
	// expires, nobody else can take the conversation.
	var second *machine.Lease
	for second == nil {
		second, err = machine.AcquireLease(ctx, engine, "chat-10", &machine.LeaseConfig{Holder: "worker-2", Duration: time.Minute})
		if err != nil && !errors.Is(err, arbortype.ErrLeaseHeld) {
			log.Fatal(err)
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // the lease has not expired yet
		}
	}
	fmt.Println("recovered:", second.Report().Requeued)
	// worker-2 holds it now, for a minute unless it renews: while its lease
	// lasts, nobody else can take the conversation.
	_, err = machine.AcquireLease(ctx, engine, "chat-10", &machine.LeaseConfig{Holder: "worker-3"})
	fmt.Println(errors.Is(err, arbortype.ErrLeaseHeld))

	runs, err := second.Claim(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	again := runs[0]
	fmt.Println("attempt", again.Task.Attempt, "from phase", again.Task.Phase)
	// The dead worker's run is fenced off: its writes are refused.
	fmt.Println(errors.Is(run.Complete(ctx, nil), arbortype.ErrLeaseLost))
	if err := again.Complete(ctx, []byte(`"done"`)); err != nil {
		log.Fatal(err)
	}
	if err := second.Release(ctx); err != nil {
		log.Fatal(err)
	}
	t, err := engine.Get(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Status, string(t.Result))
	// Output:
	// recovered: [1]
	// true
	// attempt 1 from phase half-way
	// true
	// completed "done"
}

// A worker of your own design runs one task as a Runner would with
// Lease.Work: the handler's nil return completes the task, its error fails
// it (retried under its policy), a panic fails it with code "panic", and a
// Wait, SleepUntil or AwaitEvent parks it.
func ExampleLease_Work() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_lease_work")
	defer done()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-11", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	lease, err := machine.AcquireLease(ctx, engine, "chat-11", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := lease.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	// The turn spawns a tool call and waits for it.
	rep, err := lease.Work(ctx, turn.ID, func(ctx context.Context, run *machine.Run) error {
		tool, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"})
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled})
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("turn:", rep.Outcome.Kind)
	kids, err := engine.Children(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	// The tool panics: the run fails, and so does the task (no retries).
	rep, err = lease.Work(ctx, kids[0].ID, func(ctx context.Context, run *machine.Run) error {
		panic("the tool broke")
	})
	if err != nil {
		log.Fatal(err)
	}
	tool, err := engine.Get(ctx, kids[0].ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("tool:", rep.Outcome.Kind, tool.Status, tool.Error.Code)
	// The settled child woke the turn: it runs again and returns nil.
	rep, err = lease.Work(ctx, turn.ID, func(ctx context.Context, run *machine.Run) error { return nil })
	if err != nil {
		log.Fatal(err)
	}
	t, err := engine.Get(ctx, turn.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("turn:", rep.Outcome.Kind, t.Status)
	// Output:
	// turn: waiting
	// tool: failed failed panic
	// turn: completed completed
}
