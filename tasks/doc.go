// Package tasks is arbor's engine: every operation of DESIGN §3 (create,
// start and claim, checkpoint and heartbeat, wait, sleep and wake, complete, fail, cancel,
// abort, transition) as one PostgreSQL transaction over package store, with
// every status write checked by package fsm first.
//
// Each operation has a pool form, which opens, retries and commits its own
// transaction, and a …Tx form that runs inside the caller's pgx.Tx (under a
// savepoint, so a refused operation leaves the caller's transaction clean
// and usable). The engine never keeps state between calls: PostgreSQL is the
// only authority.
//
// # Locking order
//
// Every transaction that can change more than one task (create a child,
// complete, fail, cancel, abort, wait, sleep, wake, transition) takes its locks in
// this order, and only in this order:
//
//  1. the conversation row (FOR NO KEY UPDATE). The task's conversation is
//     read first without a lock; it never changes, so this is safe;
//  2. task rows, ancestors before descendants (the task an operation is
//     about, then the owner it reconciles is already covered by 1, see below);
//  3. among tasks of the same depth, ascending id.
//
// Because every multi-task transaction of a conversation first takes that
// conversation's row lock, two of them never interleave: the conversation
// lock serialises them, and the task locks they take after it can never
// form a cycle. Self-only writes (start, claim, checkpoint, heartbeat) lock
// only their own task row, and hold no other lock while waiting for it, so
// they cannot close a cycle either: at worst they wait for a multi-task
// transaction to finish, and then see its result (a task aborted while its
// checkpoint waited gets ErrAborted, and nothing is written).
//
// This is also what makes wake-ups impossible to lose (DESIGN §3.4): a
// parent entering a wait and a child settling both hold the conversation
// lock, so one of them commits first and the other sees it. The parent either
// sees the child settled and does not park, or parks and the child's settle
// then sees it waiting and wakes it.
//
// # Failure cases
//
//   - A serialization failure or deadlock (which the order above should make
//     impossible) is retried by the pool forms, a bounded number of times
//     ([Config.TxRetries]); a …Tx form returns it to the caller, whose
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
//     invariants of DESIGN §4.
package tasks
