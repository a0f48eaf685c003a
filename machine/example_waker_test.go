package machine_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// A process that runs tasks starts one Waker: it works River's wake queue
// and keeps timers, so a task that sleeps wakes on time, and wakes even if
// the process that put it to sleep is gone.
func ExampleWaker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres:///arbor")
	if err != nil {
		log.Fatal(err)
	}
	engine, err := tasks.New(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	waker, err := machine.NewWaker(engine, &machine.WakerConfig{
		OnWake: func(ev machine.WakeEvent) { log.Printf("task %d is pending again (%s)", ev.TaskID, ev.By) },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := waker.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = waker.Stop(ctx) }()

	// In a handler, holding the task's token: come back in two seconds.
	var taskID, token int64
	if _, err := engine.SleepUntil(ctx, taskID, token, time.Now().Add(2*time.Second), "backoff", nil); err != nil {
		log.Print(err)
	}
}
