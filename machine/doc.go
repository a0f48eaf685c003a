// Package machine runs arbor inside a process: the per-conversation
// machines and the node runner (docs/design.md §3.8), and the wake-up service of
// docs/design.md §3.7, [Waker], which starts the River client that works the wake
// queue and keeps local timers so that sleeps end on time.
//
// A machine decides nothing itself about tasks: every change goes through
// package tasks, in the engine's transactions and locking order, and every
// wake, whether it comes from River, from a timer or from two nodes at
// once, goes through the engine's one idempotent path
// ([tasks.Engine.WakeSleeping]). Process memory here is a cache: a timer
// lost with its process costs latency, never a wake, because River's job
// for the sleep is in the database.
//
// # The runner
//
// One [Runner] per node claims conversations that have runnable work (a
// pending task of a kind it has a handler for, or a running task left by a
// dead holder) and no live holder, up to RunnerConfig.Capacity. Claiming a
// conversation is one transaction: the lease UPDATE (owner, epoch + 1,
// deadline by the database clock) locks the conversation row, and
// reconcile.OnOpen recovers its tasks under that lock. Each held
// conversation gets a machine: a goroutine that claims its runnable tasks
// (epoch-fenced, see tasks.Engine.ClaimRunnable) while worker slots are
// free (RunnerConfig.Workers, shared by the node), runs their handlers,
// and releases the conversation when it has been idle for
// RunnerConfig.IdleRelease. The runner renews every lease it holds each
// third of RunnerConfig.LeaseDuration in one statement; a lease it fails to
// renew was taken over, and that machine stops at once (its handlers'
// contexts are cancelled; their writes would be refused anyway).
//
// # Fencing
//
// A machine that lost its lease (a paused process, a partition) cannot
// change anything: its claims are fenced by its epoch (share lock on the
// conversation row), and every write of a running handler is fenced by the
// task's token, which the take-over's recovery made dead (running → pending,
// attempt + 1) in the take-over's own transaction. Children a handler
// spawns are fenced by the same token. A take-over happens only after the
// lease expired (or was released).
//
// # Notifications
//
// Every engine transaction that changes more than one task announces its
// conversation on the schema's change channel at commit. The runner LISTENs
// on it: a held conversation's machine re-reads at once (new work; a task it
// runs aborted or cancelled, whose handler context it then cancels), and a
// conversation with no holder is claimed at once. A missed notification
// costs latency only: every machine re-reads on RunnerConfig.PollInterval,
// and the claim loop polls on the same interval.
//
// # Failure cases
//
//   - The node dies: its leases expire; another runner's claim loop takes
//     its conversations over and recovers them. Nothing is lost.
//   - A claim's COMMIT gets no answer (the connection is lost while it is
//     in flight, tasks.ErrAmbiguous): if it committed, the tasks it claimed
//     run under the machine's lease with no handler. The machine looks for
//     them (running at its epoch, not run here), after locking the
//     conversation row so that a COMMIT still under way in the server ends
//     first, and runs them with the tokens the claim gave them.
//   - A handler blocks: the watchdog logs a warning when it passes its task
//     lease, and cancels its context at twice the lease.
//   - A handler panics: a failure (with the panic and stack), not a crash.
//   - A task's kind is unknown here (a rolling deploy): the runner never
//     claims it, so another node that knows it does; a machine whose
//     conversation has only such work releases it. Past
//     RunnerConfig.UnknownKindGrace a never-started task of a kind no runner
//     claimed is failed with code "unknown_kind".
//   - Shutdown: Stop stops claiming, lets handlers finish for
//     RunnerConfig.ShutdownGrace, then cancels the rest and releases every
//     lease; a task still running is recovered by the next holder.
package machine
