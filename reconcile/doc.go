// Package reconcile describes what arbor's recovery did to a conversation
// when a runner or a [machine.Lease] took it over: the [Report] that
// machine.RunnerConfig.OnReconcile receives for every take-over, and that
// the runner logs.
//
// The recovery itself (docs/design.md §3.8) runs inside the runner, in the
// transaction that takes the conversation's lease, so a take-over and its
// recovery commit together or not at all:
//
//   - a task left running by a dead holder goes back to pending with its
//     phase and state kept ([Report.Requeued]); the run counts as a restart
//     (attempt + 1, [Report.Restarted]) only when its holder lapsed, not
//     when it released the conversation or the database restarted; a run
//     its own runner claimed and never entered, given back by that runner
//     (a stop, a reopen after its fence), is requeued uncounted whatever
//     its kind;
//   - a task with abandon_on_restart is settled cancelled instead (code
//     "abandoned_on_restart", [Report.Abandoned]): it is never run twice;
//   - a task whose recovery would take attempt past its restart_limit is
//     settled failed (code "restart_limit_exceeded", [Report.LimitExceeded]);
//   - waits that are satisfied and completing tasks whose foreground
//     children have all settled are moved on ([Report.WaitsWoken],
//     [Report.Completed]).
//
// A user never calls recovery: it happens whenever a conversation changes
// hands. This package holds only the report, so that a callback can read it.
//
// [machine.Lease]: https://pkg.go.dev/github.com/arborhq/arbor/machine#Lease
package reconcile
