// Package machine runs arbor's tasks inside your process. A [Runner] takes
// the conversations that have work, claims their runnable tasks and calls
// your [Handler] for each, with a [Run]: the handler's view of its task,
// through which it checkpoints ([Run.Checkpoint]), spawns children
// ([Run.Spawn], [Run.SpawnMany]), waits for them ([Run.Wait]), sleeps
// ([Run.SleepUntil]), awaits an event ([Run.AwaitEvent]) and completes
// ([Run.Complete]). A handler that returns an error fails its try, which is
// retried as the task says (MaxRetries) unless the error is [NonRetryable].
//
// To start, make a tasks.Engine on a migrated schema, map each task kind to
// its handler, and start a runner in every process that should run tasks:
//
//	runner, err := machine.NewRunner(engine, map[string]machine.Handler{
//		"turn": func(ctx context.Context, run *machine.Run) error {
//			return run.Complete(ctx, []byte(`"hello"`))
//		},
//	}, &machine.RunnerConfig{})
//	if err != nil {
//		return err
//	}
//	if err := runner.Start(ctx); err != nil {
//		return err
//	}
//	defer runner.Stop(ctx)
//
// Then create tasks with tasks.Engine.Create from any process: every runner
// hears of new work on the schema's change channel, and one of them takes
// the conversation and runs it. [RunnerConfig] documents each setting and
// its default; the zero value suits most nodes.
//
// A handler may run again: when its node dies or loses its lease, another
// runner takes the conversation over and runs the task again from its last
// checkpoint (docs/design.md §3.8). Resume from run.Task.Phase, and mark a
// task whose side effect must never happen twice AbandonOnRestart.
// [Lease] is for code that runs a conversation's tasks itself, without a
// Runner. The runnable examples are machine/example_*_test.go. How the
// runner works inside (leases, fencing, batching, the audit, its locking
// order) is docs/architecture.md, "Inside the runner".
package machine
