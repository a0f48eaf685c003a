// Package core is arbor's engine: every operation of docs/design.md §3
// (create, start and claim under a lease, checkpoint and heartbeat, wait,
// sleep and wake, complete, fail, cancel, abort, and the recovery
// primitives) as a function that runs inside a transaction it is given,
// over internal/store, with every status write checked by package fsm first.
//
// It is internal: package tasks exposes the application's operations,
// package machine a handler's (machine.Run) and the runner's claims, and
// internal/recovery the recovery it composes from the primitives here. Tx
// and Savepoint are the one place a transaction is opened, retried and
// committed (the pool forms) or nested under a savepoint (the …Tx forms).
// The engine never keeps state between calls: PostgreSQL is the only
// authority.
//
// # Locking order
//
// Every transaction that can change more than one task (create a child,
// complete, fail, cancel, abort, wait, sleep, wake, recovery, release)
// takes its locks in this order, and only in this order:
//
//  1. the conversation row (FOR NO KEY UPDATE). The task's conversation is
//     read first without a lock; it never changes, so this is safe;
//  2. task rows. Bulk locks (the subtree of an abort, a conversation's live
//     tasks) are taken in one statement in ascending id order, which is
//     ancestor-first: the tasks table checks that an owner's id is smaller
//     than its children's. A single task is locked before the rows its
//     change reaches; when settling a task climbs the tree (a waiting owner
//     woken, a completing owner completed, and so on up), each owner is
//     locked as the climb reaches it.
//
// The conversation lock is what makes deadlock impossible by construction:
// two multi-task transactions of one conversation never run at once, so
// the task locks they take after it cannot form a cycle, whatever their
// order. Self-only writes (checkpoint, heartbeat) lock only their own task
// row, and starts and claims share-lock the conversation row (the lease's
// fence) and then lock the task rows they start; none of them holds a task
// row while it waits for a conversation row, so they cannot close a cycle
// either: at worst they wait for a multi-task
// transaction to finish, and then see its result (a task aborted while its
// checkpoint waited gets ErrAborted, and nothing is written). A progress
// entry locks the conversation row, then share-locks its task row, in one
// statement (the same order); the share lock checks the run's token
// against the task's newest version, so one that waited for the
// conversation sees what the holder before it did. Claims skip locked
// rows instead of waiting.
//
// One caveat for a caller's own transaction: one that does a self-only
// write and then a multi-task one holds a task row while it waits for the
// conversation lock, and can deadlock with a multi-task transaction that
// holds the conversation and wants that row. PostgreSQL detects it and
// aborts one of the two; the pool forms retry. Do the multi-task operation
// first in such a transaction.
//
// This is also what makes wake-ups impossible to lose (docs/design.md §3.4): a
// parent entering a wait and a child settling both hold the conversation
// lock, so one of them commits first and the other sees it. The parent either
// sees the child settled and does not park, or parks and the child's settle
// then sees it waiting and wakes it.
//
// # Failure cases
//
//   - A serialization failure or deadlock (which the order above should make
//     impossible) is retried by Tx, a bounded number of times
//     (Config.TxRetries); Savepoint returns it to the caller, whose
//     transaction it is.
//   - A connection lost while COMMIT was in flight is reported as
//     [ErrAmbiguous]: the transaction may or may not have committed, and the
//     engine never guesses. A connection lost before COMMIT was sent means
//     nothing was written, and the error says so by not being ErrAmbiguous.
//   - Bad input (unknown ids, foreign owners, invalid transitions, stale
//     tokens, malformed or oversized JSON, empty kinds) is refused with a
//     sentinel or typed error before anything is written; when a refusal is
//     found mid-transaction the transaction (or savepoint) is rolled back.
//   - A process that dies mid-transaction writes nothing: PostgreSQL rolls
//     the transaction back. Every state the engine commits satisfies the
//     invariants of docs/design.md §4.
package core
