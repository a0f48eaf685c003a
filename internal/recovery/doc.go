// Package recovery is arbor's recovery (docs/design.md §3.8): what happens
// to a conversation's tasks when a holder takes the conversation over,
// because the holder before it died, was partitioned, or released it.
//
// The runner and package machine's leases call it, inside the transaction
// that takes (or releases) a lease. What a user sees of it is
// [reconcile.Report], which machine.RunnerConfig.OnReconcile receives for
// every take-over (package reconcile holds only that type).
//
// [OnOpen] runs inside the transaction that takes the conversation's lease,
// so a take-over and its recovery commit together or not at all, under the
// conversation's row lock:
//
//   - every running task is from a dead holder (the lease that covered it
//     expired or was released): it goes back to pending with attempt + 1,
//     its phase and state kept, and its old token is dead from then on;
//   - a task with abandon_on_restart is settled cancelled instead (code
//     "abandoned_on_restart"), its foreground subtree aborted first: it is
//     never run twice;
//   - a task whose recovery would take attempt past its restart_limit is
//     settled failed (code "restart_limit_exceeded");
//   - waits are re-checked and completing tasks whose foreground children
//     are all settled are completed (every settle already does both in its
//     own transaction, so this repairs only what something other than the
//     engine wrote).
//
// It returns a [reconcile.Report] of what it did, which the machine logs.
//
// Locking: the caller's transaction holds the conversation row (taken by
// the lease UPDATE); OnOpen then locks running tasks one at a time in
// ascending id order, and the engine primitives it calls follow the
// engine's order (internal/core/doc.go, "Locking order"). A handler of
// the dead holder that is still alive (a paused process) and writes
// concurrently either commits first (its write stands, and is then
// recovered) or finds its token dead.
//
// Package recovery must not start goroutines, hold state, or talk to
// PostgreSQL except through the engine (internal/core) and internal/store.
package recovery
