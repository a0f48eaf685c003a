// Package machine runs arbor's tasks inside your process. A [Runner] takes
// the conversations that have work, claims their runnable tasks and calls
// your [Handler] for each, with a [Run]: the handler's view of its task,
// through which it checkpoints, spawns children ([Run.SpawnMany]), waits
// for them ([Run.Wait]), sleeps, awaits an event and completes
// ([Run.Complete]). A handler that returns an error fails its try, which is
// retried as the task says (MaxRetries) unless the error is [NonRetryable].
//
// To start, make a tasks.Engine on a migrated schema and start a runner in
// every process that should run tasks, with a map from each task kind to
// its [Handler]:
//
//	runner, err := machine.NewRunner(engine, handlers, &machine.RunnerConfig{})
//	if err != nil {
//		return err
//	}
//	if err := runner.Start(ctx); err != nil {
//		return err
//	}
//	defer runner.Stop(ctx)
//
// A handler is as small as
//
//	func(ctx context.Context, run *machine.Run) error {
//		return run.Complete(ctx, []byte(`"hello"`))
//	}
//
// Then create tasks (tasks.Engine.Create) from any process: a runner hears
// of them at once and runs them. [RunnerConfig] documents each setting and
// its default; the zero value suits most nodes.
//
// A handler may run again: when its node dies or loses its lease, another
// runner takes the conversation over and runs the task again from its last
// checkpoint (docs/design.md §3.8). Resume from run.Task.Phase, and mark a
// task whose side effect must never happen twice AbandonOnRestart. Another
// node waits for the dead node's lease (RunnerConfig.ConversationLease)
// first; a runner on the same host proves the death at once instead, by a
// lock file the kernel releases when the process dies
// (RunnerConfig.LifeDir), so a process killed and restarted at once runs
// its conversations again within about a second. [Lease]
// runs a conversation's tasks without a Runner. Examples:
// machine/example_*_test.go. How the runner works inside (leases, fencing,
// batching, the audit, its locking order): docs/architecture.md.
package machine
