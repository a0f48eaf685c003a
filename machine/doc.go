// Package machine runs arbor inside a process: the node [Runner], which runs
// the handlers of the conversations it holds; a handler's view of its task,
// [Run]; [Lease], for code that runs tasks itself; and the wake service
// (River's client for the wake queue, and local timers so that sleeps end
// on time).
//
// A runner decides nothing itself about tasks: every change goes through the
// engine (internal/core), in the engine's transactions and locking order.
// Process memory is a cache: whatever it loses costs latency, never work,
// because PostgreSQL holds every task, lease and wake job.
//
// # Holders and their leases
//
// A conversation is held by a holder — a runner's node, or one Lease — at
// an epoch: the conversation row names the holder (holder, the name shown
// to operators, and holder_id, the holder's row in the holders table) and
// the epoch, and only a transaction that holds the conversation's row lock
// changes them (a take-over, a release). The lease itself is the holder's
// row: a holder holds all its conversations while its row's deadline has
// not passed, by the database's clock, and renews them all with one
// single-row UPDATE. Nothing else locks a holder's row (a take-over only
// reads it), so a renewal waits for no lock that a user's statement, an
// abort, a flush, a long transaction or a migration can hold on a
// conversation: one stuck conversation cannot keep a node from renewing.
// The cost of holding does not grow with the conversations held.
//
// A holder row is a life, not a name: a runner inserts a row of its own
// when it starts (and a new one after its row expired in the database), a
// Lease one per AcquireLease. Two processes given the same NodeID are two
// lives and never fence each other's writes as their own.
//
// A conversation can be taken only when it has no holder, or its holder's
// row has expired (or is gone). The take-over locks the conversation row
// (skipping it while another transaction holds it), bumps the epoch, and
// recovers, in the same transaction, every task left running
// (reconcile_on_open): each goes back to pending and its token dies, so no
// write of the former holder can land.
//
// # Fencing
//
//   - Writes: a start or claim is fenced by the conversation row's lock
//     and the holder's id and epoch read under it; every write of a run by
//     its token, which every recovery kills.
//   - Handlers, across nodes: a runner stops its handlers before its lease
//     can have expired, from its local clock alone. Confirmed is the send
//     time of the last renewal that succeeded, plus the lease (the
//     database's deadline counts from when the statement ran, so it is no
//     earlier). At confirmed − lease/4 the fence fires: every handler's
//     context is cancelled and every held conversation is marked lapsed.
//     The fence is a timer goroutine that touches neither the pool nor the
//     network, and every handler context also checks the clock in its Err
//     method, so that a process resumed from a freeze sees its context
//     cancelled at its very next check, before the timer goroutine has run.
//     A handler then has the last quarter of the lease to return before
//     another node may take its conversation. A renewal whose answer comes
//     back after the fence point fires the fence before it confirms the
//     lease, even if the fence's goroutine was starved and had not: until
//     its commit, a take-over read the old row, possibly expired. And a
//     renewal confirms only what its send time vouches for: one sent before
//     a freeze and answered after it may leave the lease past its fence
//     point, or a moment from expiring in the database. Such an answer ends
//     nothing: the fence stays fired and the renewer renews again at once,
//     instead of a sixth of the lease later, when the row may have expired
//     and every conversation of the node gone free. For the same reason the
//     next renewal is due a sixth of the lease after the send of the last
//     one that confirmed, not after its answer.
//   - Handlers, on one node: a task has at most one handler running on a
//     node, measured from the handler's entry to its return. A run claimed
//     for a task whose previous handler has not returned (cancelled, or
//     returning from the ending call that made the task runnable again)
//     waits for it: it is dispatched when the old handler returns. A handler
//     that ignores its cancelled context keeps its task held — its
//     conversation is never released while one of its handlers lives —
//     and the runner warns, naming it, every lease while it does.
//   - No claim and no dispatch while unconfirmed: while the lease is not
//     usable (past confirmed − lease/4, or the fence fired and no renewal
//     has confirmed it since), the producer opens and claims nothing, a
//     wake claims nothing, and a completer flush applies its outcomes but
//     claims nothing. The database would take such a claim, under a row
//     not yet expired, but the run could not be started: its task would
//     wait, running, for a reopen or for the node that takes its
//     conversation over, which counts it as a restart. Runs claimed by a
//     transaction that was under way when the fence fired are not started;
//     their conversations are re-validated first (below).
//
// After the fence fired, the next renewal that succeeds re-validates every
// lapsed conversation in a reopen transaction: locked (skipping those
// another transaction holds, which are tried again), still held by this
// life at the epoch known, its tasks left running recovered, its runnable
// work claimed. One taken over meanwhile is forgotten. When the renewal
// finds this life's row expired in the database, the runner starts a new
// life; its former conversations are then free, and it takes back through
// the open path those no other node took.
//
// # Restarts: what counts
//
// A task's attempt counts the recoveries of runs whose holder died or lost
// its lease while running them (docs/design.md §3.8): a take-over of a
// lapsed holder's conversation. It does not count a recovery of runs the
// recovering runner stopped itself (a fence that fired, a lapse it noticed,
// a release at idle or at shutdown, a Lease's release), nor a take-over of
// a holder whose last renewal came before the database server's start or
// its promotion (a database restart or a failover lapses every holder at
// once). So a dropped connection, ErrUnavailable, a database restart or a
// failover never spends a task's restart_limit.
//
// Nor does a recovery by this node abandon a run whose handler it never
// entered. A transaction of this node that claims (a flush, the producer,
// a reopen) records each run it claims as unstarted (Runner.unstarted, by
// token), inside the transaction, before it commits. The run is taken off
// when its handler is entered, under Runner.mu, after a last check of its
// context there; the fence cancels every run under Runner.mu before it
// marks their conversations lapsed, so a run entered is taken off before a
// reopen can look. A run claimed while the fence was firing (a flush whose
// commit was on its way through a database restart), or whose context was
// cancelled before its handler began, stays unstarted, and the recoveries
// this node makes (a reopen, a take-back in a new life, a release) requeue
// it, uncounted, even if its task is abandon_on_restart: no handler saw
// it, so it cannot have made its side effect. (A chaos run saw an
// abandon_on_restart task abandoned by a database restart: claimed by a
// flush that committed while its conversation was lapsed, never called.)
// Another node taking the conversation over cannot know, and abandons such
// a task as docs/design.md §3.8 says. An entry of a conversation this node
// neither holds nor has lapsed is forgotten after a minute or ten leases,
// whichever is longer; tokens are never reused, so an entry left over
// changes nothing.
//
// # The runner's services
//
// A runner's cost is per batch, not per task or per conversation it holds.
// It has no goroutine, ticker or poll per conversation. Its services:
//
//   - the lease: the renewer renews the node's holder row every sixth of
//     the lease on a connection of its own (never behind the application's
//     pool), and the fence stops the handlers when renewals stop confirming
//     it (above);
//   - the producer: one goroutine that starts work while worker slots are
//     free. One transaction claims runnable tasks in the held conversations
//     a notification marked dirty (locked first, in id order, skipping
//     those another transaction holds: looked at again shortly, or, when
//     a flush of this node holds them, when it ends), or, on the slow
//     poll, across every held one; another takes up to K conversations that
//     have work and no live holder — those the change channel named, by
//     primary key, or found by a scan on the slow poll — with the epoch
//     bump, recovery for those with anything to recover, and the claim of
//     their runnable tasks, in one transaction. K is the free slots, and the
//     room left under Capacity; a full node releases its longest idle
//     conversations only as far as there is work to open;
//   - the completer: a handler's ending call (complete, wait, sleep, the
//     failure of a returned error) and its spawns are queued, and a flush
//     applies everything queued in one transaction of a handful of
//     statements — conversations locked in id order, skipping those
//     another transaction holds, tasks checked by token, settled with
//     unnest, owners reconciled set-based — and claims, in the same
//     transaction, the runnable work those settles created. The outcomes of
//     a skipped conversation go again in a later flush (after this node's
//     flush that holds it, or after a short backoff), so a conversation
//     locked by someone else delays only its own outcomes. The tasks a
//     flush aborted (a fail_fast wait tripped) that run here have their
//     handlers cancelled as soon as it commits. A flush starts as soon as
//     the last one committed, so batches grow with the load. Besides its
//     Flushers lanes, the completer has an express lane, so that an ending
//     call never waits behind a batch in flight (below);
//   - workers: one goroutine per running handler, at most Workers at once.
//     A run's slot is given back when its ending call is queued;
//   - the listener LISTENs to the schema's change channel: a notification
//     names a conversation; a held one is marked for a claim (and its
//     running handlers are checked: an abort or cancel elsewhere cancels
//     their context), an unheld one wakes the producer;
//   - the watchdog checks running handlers against the database (a task
//     stopped elsewhere) with a bounded wait, and warns about a handler
//     that spent longer than its task lease outside arbor's calls without
//     a checkpoint or heartbeat; time spent inside an arbor call (waiting
//     for a flush) is not the handler's;
//   - announcements: what the runner's commits mean for others (a flush's
//     log and its conversations, a claim's runs, a handler's progress
//     entry) is announced after the commit, coalesced, by one sender on a
//     connection of its own (internal/core/announce.go), so that a
//     follower's news waits for no connection of the work pool;
//   - maintenance: deadlines, wall-time budgets, unknown kinds, lapsed
//     reservations, the holder rows of lives long over, and the audit of
//     what the node holds (below).
//
// Where each lives: the Runner, its start and stop in runner.go; the lease
// (nodeLease: renewer and fence) in holder.go, what the runner does when it
// fires or is confirmed again in lapse.go; the producer (type producer) in
// producer.go, and the releases it and Stop make (idle, for room, at
// shutdown) in release.go; the completer (type completer) in completer.go,
// and what this node knows of its flushes in flight in each conversation
// (the outcomes and claims that wait for their end) in flush_order.go; the
// workers (slots, dispatch, a handler's start and return) in runner_runs.go,
// and the runs claimed and not yet started, which this node's recoveries
// requeue, in unstarted.go; the listener and what it marks in
// runner_news.go; the watchdog (type watchdog) in watchdog.go; maintenance
// (type maintainer) in maintenance.go, and the audit in audit.go; the pools
// in runner_pools.go.
// Runner.Start starts each service's goroutines and Runner.Stop stops them,
// in one place each.
//
// What the node holds and runs (held and lapsed conversations, running,
// waiting and unstarted runs, worker slots, flushes in flight per
// conversation) is the Runner's, under Runner.mu; each service keeps its own
// state under its own mutex: the producer what it has been told to look at
// (conversations that may have work, the wants of a scan or a reopen), the
// completer its queue, the watchdog its checks, the lease its renewal and
// fence, and the maintainer nothing (it reads and writes the database only).
// In-process locks are taken in this order, never the other way:
// nodeLease.fireMu (held while the fence fires or is confirmed again, which
// marks the held conversations lapsed under Runner.mu) or Runner.claimMu
// (read by every transaction that claims, written by an adoption and by the
// audit when it found something to repair; neither waits for a row lock
// while it holds it); then
// Runner.mu; then one service's own mutex (producer.mu, nodeLease.mu for the
// holder's id; completer.mu and watchdog.mu are never held with Runner.mu).
// A step that decides by what the node holds (a conversation held: marked
// for a claim; released: news for the producer) is made under Runner.mu and
// producer.mu together, so a release and a mark cannot interleave.
// Runner.mu is never held across a database call, so a transaction may take
// it briefly while it holds row locks (a claim recording its runs as
// unstarted, a recovery asking whether a run is, a flush taking in parked
// outcomes) without waiting on anything that waits on the database.
//
// The producer, completer, maintenance and River's wake client use the
// runner's own pool (RunnerConfig.Pool; by default one made from the
// engine pool's configuration), the renewer and the watchdog a connection
// each of their own, and the LISTEN connection is the process's one for the
// engine's pool (internal/notify: one backend shared with the waker and the
// engine's followers, hijacked from the pool so it takes no slot): a Runner never
// starves the application's pool, nor is starved by it.
//
// Leases are held across turns: a conversation stays held while the node
// lives and has capacity, and is released when it has been idle for
// IdleRelease, when the node needs room for a conversation with work (the
// longest idle first), or at shutdown — each time only when no handler of
// it runs here.
//
// # The completer's express lane
//
// A batch lane takes everything queued (up to MaxBatch), so an outcome
// queued while every lane is busy waits for a batch to commit before its
// own flush even begins: with a deep queue, twice a batch's time. The
// express lane is one more flush, beside the Flushers batch lanes, for
// ending calls only (complete, wait, sleep, await, a failure — not
// spawns, whose inserts make the heavy batches):
//
//   - An ending call queued while every batch lane is in flight starts the
//     express flush, if it is not in flight already. It takes the queued
//     endings, oldest first, at most expressBatch of them, and leaves the
//     spawns (and any endings beyond) to the batch lanes.
//   - When it commits, it goes again only while every batch lane is still
//     in flight and endings are queued; otherwise the batch lanes take
//     what is left, as before. A shallow queue so costs no extra flush, and
//     a deep one a small batch beside the big ones, with one connection
//     more in the runner's own pool (Flushers + 1 + WorkPoolExtraConns).
//   - An express flush is a flush: the same transaction and statements,
//     the same locking order (conversations in id order, skipping those
//     another transaction holds, then task rows), every write fenced by its
//     run's token, and the claim of the work its settles made runnable in
//     the same commit — so the owner a child's completion wakes is
//     re-entered from the express flush's own commit. A transient fault is
//     retried whole, a refused set-based statement goes one outcome at a
//     time, and an unknown commit is resolved by pg_xact_status, exactly as
//     for a batch lane: the express lane changes which flush an outcome
//     goes in, never what a flush does.
//   - An outcome queued while a flush of this node is in flight in its
//     conversation (it holds the conversation's lock, or is about to take
//     it) is not flushed on its own: it is parked behind that flush, which
//     takes it in — with the outcomes queued meanwhile in the conversations
//     it has locked — once its own are applied, before its claim, so that
//     both commit together (Engine.Flush's more; endings only, for the
//     express lane). One parked after the flush asked, or behind a flush
//     that skipped the conversation, goes when that flush ends. A child's
//     Complete and its parent's Wait, made at once, so commit in one
//     flush, not in two one after the other. Two flushes of this node may
//     still meet in a conversation (an outcome taken by a lane before
//     another flush began in it): the later one skips the conversation the
//     earlier one holds, and its outcomes there go again when that flush
//     ends. So an ending cannot overtake writes to its own conversation,
//     only other conversations' batches.
//   - Order: writes a caller makes one after another are queued one after
//     another (each call waits for its outcome), so taking endings before
//     spawns queued earlier reorders only writes that no caller ordered
//     (of different runs, or made at once from goroutines of one handler);
//     within a conversation the commit order is the lock order, as before.
//   - Stop waits for the express flush like any other; after stop, writes
//     go straight to the database.
//
// An ending also does not wait behind a claim with nothing to claim. A
// flush reserves one slot more than its outcomes, so that a claim which
// filled its slots means the slots ran out (the producer then claims the
// rest in those conversations), not that each outcome made exactly one
// task runnable — a wait's child, a child's owner — which would send the
// producer to lock, just as that child's completion comes, a conversation
// the flush had already claimed everything in. And the producer's claim
// in conversations it was told of (a notification, a flush's
// conversations, one skipped before) locks only those that have a
// pending task: its check and its locks are one statement, whose snapshot
// comes after the commit that marked the conversation (the notification
// is received after that commit, a flush marks after its own), so it sees
// whatever that commit made runnable; one with nothing pending has
// nothing the claim could take, and is neither locked nor tried again:
// work made runnable in it later — also by a transaction in flight at the
// check — is announced at its commit, claimed by the flush that made it,
// or found by the slow poll, like any work that comes after a claim. A
// conversation with work that another transaction holds is tried again as
// before.
//
// # The audit: what the node holds, against the database
//
// What the node knows of its conversations and runs can be wrong in two
// ways that nothing else would repair while the node lives and renews its
// lease: a task running under this node's lease, at the epoch it holds the
// conversation, with no run of its token here; or a conversation the
// database says this life holds that the node neither holds nor has
// lapsed. Either is left by a write or a read that went where it should
// not: after a split brain of the HA system (a network healed before the
// old primary stepped down: clients reconnect to it, and what they write
// there its rewind discards; the watchdog's read there stops a run that
// was still its task's), or by a commit whose answer was lost and could
// not be resolved. So every audit interval (the longer of the conversation
// lease and ten poll intervals; audit.go) the maintainer has the runner:
//
//  1. read, with no lock of its own, the conversations this life holds
//     and the tasks running in those it holds, and look, under Runner.mu:
//     the tasks running at the epoch the node holds their conversation
//     with no run of their token here (running, waiting, or with an
//     outcome still queued in the completer), and the conversations held
//     in the database, neither held nor lapsed here, with no run of this
//     node in them. Nothing found (the usual case): done, no lock of the
//     claims taken;
//  2. otherwise take Runner.claimMu for writing, so that no claim is
//     between its commit and its dispatch (every claiming transaction
//     holds it for reading from before its transaction to after its
//     dispatch), and look again: what the first look saw of a claim on
//     its way to dispatch is gone now;
//  3. for each conversation with lost runs, in a transaction that locks it
//     at the epoch held, recover those of its tasks still running under
//     the token read — requeued, not counted; an abandon_on_restart one
//     whose handler was called is abandoned, as any cut run is — and mark
//     it for a claim; for each conversation held unawares, release it as a
//     release does (its running tasks recovered, not counted), and make it
//     news for the producer. Each transaction skips a conversation that
//     changed hands, or that another transaction holds locked (SKIP
//     LOCKED: the audit never waits for a row lock while it holds
//     claimMu, which would pause every claim and flush of the node); the
//     next audit looks at it again. The repairs are bounded by the
//     conversation lease.
//
// A run that ended normally is never taken for lost: it stays among the
// node's runs until its ending write has returned, and a task the read saw
// running whose ending committed since is no longer running under the lock.
// Nor is a run whose caller stopped waiting for its ending (a context of
// the handler's own that ended first): its token is counted as queued
// (Runner.queuedLate) until the completer gives that outcome its result.
// The audit does not start while the lease is not usable (a reopen
// re-validates then) or the runner stops; if the fence fires or Stop
// begins during its repairs, their writes are fenced by holder and epoch
// like any other. While a commit's answer is unresolved, adoption
// (Runner.adopt) may run a lost claim under its own token before the audit
// sees it. Not repaired by the audit: a conversation the node holds at an
// epoch other than the database's (adoption's case), and lost runs in a
// conversation being released (the release recovers them). It costs two
// reads per interval.
//
// # Locking order
//
// Every transaction takes conversation rows first, in id order, then task
// rows (docs/design.md §5); a holder row is read, never locked, except by
// its own renewal, a take-over of its conversations locks only them. Claims
// lock the conversations they claim in exclusively (FOR NO KEY UPDATE), as
// every writer of a conversation's log holds its row, so that the log's
// order is its commit order — and skip rows other transactions hold (both
// the conversation and the task rows: a claim never waits, so it cannot
// close a cycle of waits with a flush or a user's operation that holds a
// conversation and wants a task row). A flush locks its conversations for
// update, in id order, skipping locked ones, before any task row.
//
// # Failure cases
//
//   - The node dies: its holder row expires; another runner takes its
//     conversations and recovers them (the restart counted). Nothing is
//     lost.
//   - The node is cut off from the database, starved, or frozen: its
//     renewals stop confirming; the fence stops its handlers at three
//     quarters of the lease; another node takes over only after the lease.
//     A process frozen past the whole lease resumes with its handlers'
//     contexts cancelled, and every write of theirs is refused.
//   - A conversation row is locked by someone else for long: its claims
//     skip it, its flushes skip it and retry, its renewal is not involved;
//     other conversations go on.
//   - A flush fails: a transient fault is retried whole; a set-based
//     statement the database refuses makes the batch go again one outcome
//     at a time, each in a savepoint. No outcome is lost or applied twice.
//   - A commit gets no answer (ErrAmbiguous) — a flush's, a claim's or an
//     open's: the runner asks the database what became of the transaction
//     (pg_xact_status), and adopts what a committed one took. After a
//     failover the id may be another transaction's: a flush called
//     committed is checked against its tasks, and an ending that did not
//     land is queued again (completer.resolve).
//   - A handler blocks: the watchdog warns when it passed its task lease
//     outside arbor's calls; it is not cancelled for it (its node holds the
//     conversation and its goroutine lives) unless RunnerConfig.BlockedAfter
//     says so.
//   - A handler ignores its cancelled context: its task stays held here,
//     its next run waits for it, and the runner warns every lease, naming it.
//   - A handler panics: a failure (with the panic and stack), not a crash.
//   - A task's kind is unknown here (a rolling deploy): the runner never
//     claims it. Past UnknownKindGrace a never-started task of a kind no
//     runner claimed fails with code "unknown_kind".
//   - The database is unavailable: a handler's write that gives up
//     (ErrUnavailable) does not fail its task. An ending write is written
//     again by the runner when the database is back; a handler cut off
//     before its end runs again with the same run, if its lease held
//     meanwhile — except an abandon_on_restart one, which is entered once
//     and abandoned instead.
//   - Shutdown: Stop stops claiming, lets handlers finish for
//     ShutdownGrace, cancels the rest, flushes the completer, and releases
//     every conversation with no handler left running, recovering any task
//     still running in the release's transaction (not counted); a
//     conversation whose handler ignored its cancellation is left to
//     lapse with the node's lease.
package machine
