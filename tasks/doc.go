// Package tasks is arbor's engine, as your application calls it: create the
// tasks of a conversation (a turn and the work it owns), read them, and
// steer them — cancel, abort a subtree leaves first, wake a sleep early —
// and check the invariants. Every operation is one PostgreSQL transaction.
//
// To start, migrate a schema (package migrations), make an engine on your
// pool with [New] and create a turn with [Engine.Create]; a runner of
// package machine then runs it. The runnable examples are
// tasks/example_*_test.go.
//
// Running tasks is not done here: a [machine.Runner] runs the handlers of
// every node, and a handler acts on its task through a [machine.Run]
// (checkpoint, spawn children, wait, sleep, complete). What an operation
// guarantees, and the state machine it follows, is docs/design.md; the row
// types are package arbortype.
//
// # Transactions
//
// Each operation comes in a pool form, which opens, commits and (on a
// serialization failure or deadlock) retries its own transaction, and a
// …Tx form that runs inside the caller's pgx.Tx under a savepoint, so that
// a task can commit together with the application's own rows, and a refused
// operation leaves the caller's transaction clean and usable. Reads take
// no lock.
//
// # Errors
//
// Every error wraps one of package arbortype's sentinels (test with
// errors.Is: errors.Is(err, arbortype.ErrNotFound)) and names the operation
// and the task or conversation. Bad input is refused before anything is
// written. A connection lost while COMMIT was in flight is
// [arbortype.ErrAmbiguous]: read the task to learn whether the operation
// applied.
//
// [machine.Runner]: https://pkg.go.dev/github.com/arborhq/arbor/machine#Runner
// [machine.Run]: https://pkg.go.dev/github.com/arborhq/arbor/machine#Run
package tasks
