// Package arbortest helps users test their handlers, as River's rivertest
// does for workers: run one handler on one task without a Runner and see
// what it did ([Work]), assert where tasks stand ([RequireSettled],
// [RequireStatus], [RequireChildren], [RequirePendingEvent],
// [RequireConsistent]), and give each test a pool and a migrated schema of
// its own ([Database], or [Schema] and [Engine] on a pool of the test's).
//
// A chat turn is tested step by step: create the turn, Work it with its
// handler (it spawns a tool call and waits), Work the tool call with the
// tool's handler (it completes, and the turn wakes), Work the turn again (it
// reads the tool's result and completes), then RequireSettled the turn with
// the answer. Each step is what a Runner would do with that task, and
// writes what a Runner would write: the task is started under a lease of
// the conversation, the handler gets a real machine.Run, and every spawn
// and ending goes through the same transaction as a Runner's batching
// completer. Nothing is mocked; the test needs a PostgreSQL (Database).
//
// What Work does not do is what a Runner does around a run: it starts only
// the task it is given (never the children, nor the owner a settle woke),
// calls the handler once (not again after a database fault), and does not
// wait for sleeps or events. A test moves the tree on itself: Work the
// children, tasks.Engine.WakeNow a sleeping task, tasks.Engine.Emit to an
// awaiting one.
//
// The Require helpers take a testing.TB and fail the test with a message
// that says what was found. Work fails the test when arbor refuses to run
// the task (not found, not pending, its conversation held by a Runner):
// nothing is written then. A handler's own error is not a test failure;
// it is in the WorkResult, with the failure or retry it caused. The
// runnable example is arbortest/example_test.go.
package arbortest
