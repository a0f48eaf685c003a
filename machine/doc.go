// Package machine runs arbor inside a process: the node [Runner], which runs
// the handlers of the conversations it holds; a handler's view of its task,
// [Run]; [Lease], for code that runs tasks itself; and the wake service,
// [Waker] (River's client for the wake queue, and local timers so that
// sleeps end on time).
//
// A runner decides nothing itself about tasks: every change goes through the
// engine (internal/core), in the engine's transactions and locking order.
// Process memory is a cache: whatever it loses costs latency, never work,
// because PostgreSQL holds every task, lease and wake job.
//
// # The runner: node-level loops, set-based statements
//
// A runner's cost is per batch, not per task or per conversation it holds.
// It has no goroutine, ticker or poll per conversation: a held conversation
// with nothing to run is a few words in a map. Its loops are:
//
//   - the producer: one goroutine that starts work while worker slots are
//     free. One transaction claims runnable tasks in the held conversations
//     a notification marked dirty (locked first, in id order, as held
//     by this node; those another transaction holds are looked at again in
//     5 ms), or, on the slow poll, across every held one; another takes up
//     to K conversations that have work and no live holder — those the
//     change channel named, by primary key, or found by a scan on the slow
//     poll — with the lease UPDATE, recovery (reconcile_on_open) for those
//     with anything to recover, and the claim of their runnable tasks,
//     fenced by the new epochs, in one transaction. K is the free slots,
//     and the room left under Capacity; a full node releases its longest
//     idle conversations only as far as there is work to open. It runs
//     when told (a notification, a completer's flush that ran out of slots,
//     a slot given back) and on a slow poll that covers missed
//     notifications;
//   - the completer: a handler's ending call (complete, wait, sleep, the
//     failure of a returned error) and its spawns are queued, and a flush
//     applies everything queued in one transaction of a handful of
//     statements — conversations locked in id order, tasks checked by token,
//     settled with unnest, owners reconciled set-based (waits satisfied,
//     completing owners completed) — and claims, in the same transaction,
//     the runnable work those settles created, for the slots the batch gave
//     back: a woken parent goes straight to a worker, with no notification
//     round trip. Each handler gets its own outcome. A flush starts as soon
//     as the last one committed, so batches grow with the load and a lone
//     outcome waits for no timer;
//   - workers: one goroutine per running handler, at most Workers at once.
//     A run's slot is given back when its ending call is queued: what a
//     handler does after it is not counted;
//   - the renewer renews every held lease in one statement, each third of
//     the conversation lease, and learns of take-overs from what it could
//     not renew;
//   - the listener LISTENs to the schema's change channel: a notification
//     names a conversation; a held one is marked for a claim (and its
//     running handlers are checked: an abort or cancel elsewhere cancels
//     their context), an unheld one wakes the producer;
//   - the watchdog checks running handlers against their task lease.
//
// Leases are held across turns: a conversation stays held while the node
// lives and has capacity, and is released when it has been idle for
// IdleRelease (long by default), when the node needs room for a
// conversation with work (the longest idle first), or at shutdown.
//
// # Locking order and fencing
//
// Every transaction takes conversation rows first, in id order, then task
// rows (docs/design.md §5). Claims lock the conversations they claim in, as
// held by this node — exclusively (FOR NO KEY UPDATE), as every writer of a
// conversation's log holds its row, so that the log's order is its commit
// order — and skip rows other transactions hold (both the conversation and
// the task rows: a claim never waits, so it cannot close a cycle of waits
// with a flush or a user's operation that holds a conversation and wants a
// task row). A flush locks its conversations for update, in id order,
// before any task row.
//
// Fencing is two-fold, as before: a start is fenced by the conversation
// lease (the holder's name and the row's lock; the epoch is recorded
// on the run), and every write of a run by its token, which recovery kills
// when it requeues the task. A node whose lease was taken over (it was
// paused, partitioned) can neither claim nor write.
//
// # Failure cases
//
//   - The node dies: its leases expire; another runner takes its
//     conversations and recovers them. Nothing is lost.
//   - A flush fails: a transient fault is retried whole; a set-based
//     statement the database refuses makes the batch go again one outcome
//     at a time, each in a savepoint, so that one refusal cannot fail the
//     others. No outcome is lost or applied twice.
//   - A commit gets no answer (the connection is lost while COMMIT is in
//     flight, ErrAmbiguous) — a flush's, a claim's or an open's: the runner
//     asks the database what became of the transaction (pg_xact_status of
//     the id its first statement read, waiting while it is in progress). Not
//     committed: the batch goes again. Committed: each outcome is over; a
//     spawn is written again by its keys to return its children; and what
//     the transaction took is adopted — leases of this node the runner did
//     not know, and runs at their epochs no handler here runs — under an
//     exclusive hold of the claim lock, so that no claim of its own is
//     between its commit and its dispatch meanwhile.
//   - The renewal is late (a slow database, a starved process): a
//     conversation whose lease no renewal confirmed within three quarters
//     of it is given up here — its handlers cancelled, before the lease can
//     expire in the database — and its next holder recovers it.
//   - A handler blocks: the watchdog warns when it passes its task lease and
//     cancels its context at twice the lease.
//   - A handler panics: a failure (with the panic and stack), not a crash.
//   - A task's kind is unknown here (a rolling deploy): the runner never
//     claims it, so a node that knows it does. Past UnknownKindGrace a
//     never-started task of a kind no runner claimed fails with code
//     "unknown_kind".
//   - The database is unavailable: a handler's write that gives up
//     (ErrUnavailable) does not fail its task; the handler runs again with
//     the same run when the database is back.
//   - Shutdown: Stop stops claiming, lets handlers finish for
//     ShutdownGrace, cancels the rest, flushes the completer, and releases
//     every lease, recovering any task still running in the release's
//     transaction: a stopped runner writes nothing.
package machine
