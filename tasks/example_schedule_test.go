package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// A schedule starts a turn at cron times (or every interval), exactly once
// per tick across every node: the runners' maintenance fires it. Here a
// nightly digest at 02:00 Paris time, in a new conversation per night, for
// one tenant; run once on the next start if the runners were all down at
// 02:00. Created at every start of the application, it is replaced, not
// doubled, and an operator's pause stays.
func ExampleEngine_CreateSchedule() {
	ctx := context.Background()
	engine, _, done := exampleEngine(ctx, "arbor_example_schedule")
	defer done()

	s, err := engine.CreateSchedule(ctx, arbortype.ScheduleParams{
		Name:     "nightly-digest",
		Tenant:   "acme",
		Kind:     "digest",
		Input:    []byte(`{"since": "24h"}`),
		Cron:     "0 2 * * *",
		TimeZone: "Europe/Paris",
		Missed:   arbortype.MissedRunOnce,
	})
	if err != nil {
		log.Fatal(err)
	}
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Name, s.NextAt.In(paris).Format("15:04"), s.Missed)

	// A fixed conversation, every ten minutes.
	if _, err := engine.CreateSchedule(ctx, arbortype.ScheduleParams{
		Name: "inbox-poll", Kind: "poll", ConversationID: "inbox", Every: 10 * time.Minute,
	}); err != nil {
		log.Fatal(err)
	}
	if _, err := engine.PauseSchedule(ctx, "inbox-poll"); err != nil {
		log.Fatal(err)
	}
	all, err := engine.Schedules(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range all {
		fmt.Println(s.Name, s.Cron, s.Every, s.Paused)
	}

	// Bad timing is refused, and nothing is written.
	_, err = engine.CreateSchedule(ctx, arbortype.ScheduleParams{Name: "typo", Kind: "digest", Cron: "0 25 * * *"})
	fmt.Println(errors.Is(err, arbortype.ErrInvalidArgument))

	if err := engine.DeleteSchedule(ctx, "inbox-poll"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(engine.DeleteSchedule(ctx, "inbox-poll"), arbortype.ErrNotFound))
	// Output:
	// nightly-digest 02:00 run_once
	// inbox-poll  10m0s true
	// nightly-digest 0 2 * * * 0s false
	// true
	// true
}
