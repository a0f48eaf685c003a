package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// completer is a runner's batching sink: the spawns and ending writes of
// its runs are queued, and flushed many at once (see docs/architecture.md).
type completer struct {
	r *Runner

	mu       sync.Mutex
	queue    []*queued
	flushing int  // batch-lane flush goroutines running
	express  bool // the express lane's flush goroutine runs
	closed   bool // after stop: writes go straight to the database
	wg       sync.WaitGroup

	// ctx bounds the resolution of a flush whose commit is unknown; stop
	// cancels it when the flushes outlive their drain.
	ctx    context.Context
	cancel context.CancelFunc
}

// queued is one run's outcome waiting for its flush.
type queued struct {
	run *Run
	o   core.Outcome
	res chan core.OutcomeResult
	// deferrals counts the flushes that skipped it (its conversation was
	// locked by another transaction), for its backoff.
	deferrals int
	// state says whether a flush has it (queuedWaiting, queuedInFlush) or
	// its caller withdrew it before any did (queuedWithdrawn): a flush
	// takes an outcome only from waiting, and its caller withdraws it
	// only from waiting, so a withdrawn outcome is never written.
	state atomic.Int32
}

const (
	queuedWaiting int32 = iota
	queuedInFlush
	queuedWithdrawn
)

// deferredWait is how long an outcome whose conversation another
// transaction held waits before the next flush tries it: 1 ms doubling
// to at most 64 ms (a conversation locked for long costs a lock attempt
// per 64 ms, and delays only its own outcomes).
func deferredWait(try int) time.Duration {
	if try >= 6 {
		return 64 * time.Millisecond
	}
	return time.Millisecond << try
}

// expressBatch bounds the outcomes of one express flush (see the package
// doc): few enough that its flush stays short beside a full batch.
const expressBatch = 32

// stopDrain bounds how long stop waits for the flushes in flight before it
// gives up resolving the ones whose commit is unknown.
const stopDrain = 30 * time.Second

func newCompleter(r *Runner) *completer {
	ctx, cancel := context.WithCancel(context.Background())
	return &completer{r: r, ctx: ctx, cancel: cancel}
}

func (c *completer) ending(run *Run) { c.r.ending(run) }

// recheck has the watchdog read run's conversation's runs back.
func (c *completer) recheck(run *Run) { c.r.watch.check(run.conv) }

// apply queues o and returns its own outcome once the flush it went in has
// committed — or at once when ctx is cancelled first (the run is over; o
// still lands, or its token's fence refuses it). A flush starts at once
// when fewer than Flushers are in flight; otherwise o goes in the next
// one, with everything queued meanwhile — or, for an ending, in the
// express flush (see enqueue).
func (c *completer) apply(ctx context.Context, run *Run, o core.Outcome) core.OutcomeResult {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return directSink{c.r.core}.apply(ctx, run, o)
	}
	q := &queued{run: run, o: o, res: make(chan core.OutcomeResult, 1)}
	// A flush of this node in the outcome's conversation holds it (or is
	// about to): the outcome waits for that flush, which takes it in
	// before its claim, or queues it when it ends — a flush of its own
	// would find the conversation locked and skip it.
	if !c.r.parkBehindFlush(q, 0) {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return directSink{c.r.core}.apply(ctx, run, o)
		}
		c.enqueue(q)
		c.mu.Unlock()
	}
	select {
	case res := <-q.res:
		return res
	case <-ctx.Done():
	}
	// The run is over. Its caller hears the truth: an outcome no flush has
	// taken is withdrawn (nothing is written, so the stop is the answer);
	// one a flush has is answered by that flush if its answer is in, and
	// is ErrAmbiguous otherwise — at once: a handler stopped by the fence
	// has only the last quarter of the lease to return. It is never told
	// refused while its write may still land.
	stopped := run.stoppedErr(ctx) // over, whatever the write does
	if q.state.CompareAndSwap(queuedWaiting, queuedWithdrawn) {
		return core.OutcomeResult{Err: stopped}
	}
	select {
	case res := <-q.res:
		return res
	default:
	}
	c.r.queuedLateBegin(run.token)
	go func() {
		<-q.res // every queued outcome gets its result, once
		c.r.queuedLateEnd(run.token)
	}()
	return core.OutcomeResult{Err: fmt.Errorf("%v, while its write was being committed: %w", stopped, arbortype.ErrAmbiguous)}
}

// enqueue queues q and starts a batch lane's flush if fewer than Flushers
// are in flight, or else, for an ending, the express lane's if it is not
// in flight (under c.mu).
//
// While the queue is not empty, a batch lane is in flight: one starts when
// an outcome is queued with fewer in flight, and one ends only when it
// found the queue empty. The express lane only takes from the queue, so
// nothing queued is left without a flush to take it.
func (c *completer) enqueue(q *queued) {
	c.queue = append(c.queue, q)
	switch {
	case c.flushing < c.r.cfg.Flushers:
		c.flushing++
		c.wg.Add(1)
		go c.flushLoop()
	case !c.express && q.o.Kind != core.OutSpawn:
		c.express = true
		c.wg.Add(1)
		go c.expressLoop()
	}
}

// expressLoop flushes the queued endings, at most expressBatch at a time,
// while every batch lane is in flight: an ending queued behind batches
// does not wait for them to commit (see docs/architecture.md, "The
// completer's express lane").
func (c *completer) expressLoop() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		var batch []*queued
		if c.flushing >= c.r.cfg.Flushers {
			batch = c.takeEndings(expressBatch)
		}
		if len(batch) == 0 {
			c.express = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.flush(batch, true)
	}
}

// takeEndings takes out of the queue its oldest endings, at most n, and
// leaves the rest in order (under c.mu).
func (c *completer) takeEndings(n int) []*queued {
	var out []*queued
	out, c.queue = take(c.queue, n, func(q *queued) bool { return q.o.Kind != core.OutSpawn })
	return out
}

// take takes out of qs, oldest first, at most n of the outcomes ok accepts,
// and returns them and the rest of qs in order (in qs's own array).
func take(qs []*queued, n int, ok func(*queued) bool) (taken, rest []*queued) {
	rest = qs[:0]
	for _, q := range qs {
		if len(taken) < n && ok(q) {
			taken = append(taken, q)
			continue
		}
		rest = append(rest, q)
	}
	clear(qs[len(rest):])
	return taken, rest
}

// requeue puts back the outcomes a flush skipped: one whose conversation
// another flush of this node holds goes again when that flush ends (its
// first few times), the others after their backoff.
func (c *completer) requeue(qs []*queued) {
	for _, q := range qs {
		q.state.Store(queuedWaiting)
		q.deferrals++
		if q.deferrals <= 3 && c.r.parkBehindFlush(q, 1) {
			continue
		}
		c.wg.Add(1)
		time.AfterFunc(deferredWait(q.deferrals-1), func() {
			defer c.wg.Done()
			if c.ctx.Err() != nil {
				// Stopping, past the drain: the conversation stayed locked.
				// The run's write is not made; the release (or the next
				// holder) recovers its task.
				q.res <- core.OutcomeResult{Err: fmt.Errorf("task %d: its conversation stayed locked by another transaction while the runner stopped: %w",
					q.o.TaskID, arbortype.ErrUnavailable)}
				return
			}
			c.mu.Lock()
			c.enqueue(q)
			c.mu.Unlock()
		})
	}
}

// stop flushes what is queued and makes later writes go straight to the
// database.
func (c *completer) stop() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	t := time.NewTimer(stopDrain)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.cancel()
		<-done
	}
	c.cancel()
}

// flushLoop flushes batches until the queue is empty.
func (c *completer) flushLoop() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.flushing--
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), c.r.cfg.MaxBatch)
		batch := make([]*queued, n)
		copy(batch, c.queue)
		c.queue = append(c.queue[:0], c.queue[n:]...)
		c.mu.Unlock()
		c.flush(batch, false)
	}
}

// takeIn takes out of the queue its oldest outcomes of the conversations
// locked (sorted), at most n, endings only if endingsOnly, and leaves the
// rest in order: they go in the flush that holds those conversations now
// (see Engine.Flush's more).
func (c *completer) takeIn(locked []string, n int, endingsOnly bool) []*queued {
	if n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*queued
	out, c.queue = take(c.queue, n, func(q *queued) bool {
		_, in := slices.BinarySearch(locked, q.o.ConversationID)
		return in && !(endingsOnly && q.o.Kind == core.OutSpawn)
	})
	return out
}

// flush applies a batch in one transaction, with the claim of the work it
// makes runnable for the slots free now, and gives each run its outcome.
// The outcomes queued meanwhile in the conversations it has locked go in
// it too, before its claim (endings only, for the express lane's).
//
//   - A set-based statement the database refuses fails the transaction: the
//     batch is applied again one outcome at a time (each in a savepoint), so
//     that one bad outcome fails only itself.
//   - The database unavailable: every run gets ErrUnavailable (its handler
//     is called again when the database is back; nothing was written).
//   - A commit whose outcome is unknown is resolved by asking the database
//     what became of the transaction (see resolve).
func (c *completer) flush(batch []*queued, express bool) {
	r := c.r
	batch = takeForFlush(batch)
	if len(batch) == 0 {
		return
	}
	ctx := context.WithoutCancel(r.runCtx)
	convs := batchConvs(batch)
	r.flushBegin(convs)
	defer r.flushEnd(convs)
	// One slot more than the outcomes: a claim that fills every slot it
	// had may have left work behind (the producer then claims the rest),
	// and with a slot per outcome, a batch whose every outcome made one
	// task runnable (a wait's child, a child's owner) would look so.
	// (core claims at most 10,000 at once, MaxBatch's bound.)
	want := min(len(batch)+1, 10_000)
	k := r.reserve(want)
	slow := false
	// tries counts the transactions tried; limit is how many of the
	// batch's outcomes the current one applies. After a fault a try takes
	// no more than the last one had (docs/design.md §3.8, "A flush's retries
	// converge"): it takes in nothing queued meanwhile, claims nothing, and
	// applies half of the outcomes the last try did; the rest go back to
	// the head of the queue once the try is over.
	tries, limit := 0, len(batch)
	for {
		// Nothing is claimed while the node's lease is not usable (the
		// fence is due or fired), checked on every try (resolving a lost
		// commit can outlast the lease): the database would still take the
		// claim, under a row that has not expired yet, but dispatch would
		// not start what it took, and the runs would wait, running, for a
		// reopen or for the node that takes the conversation over (counting
		// them as restarts). Nor once the runner is stopping (see Stop).
		// The outcomes are applied all the same: a run's token fences them.
		if k > 0 && (!r.lease.usable(time.Now()) || r.isStopping()) {
			r.unreserve(k)
			k = 0
		}
		var xact int64
		r.claimMu.RLock()
		res, err := core.Tx(ctx, r.core, func(tx pgx.Tx) (core.FlushResult, error) {
			tries++
			claim := k
			var more func(locked []string) []core.Outcome
			if tries == 1 {
				limit = len(batch)
				// The outcomes queued meanwhile in the conversations this
				// flush locked go in it (first try only).
				more = func(locked []string) []core.Outcome {
					extra := r.takeParked(locked, r.cfg.MaxBatch-len(batch), express)
					extra = append(extra, c.takeIn(locked, r.cfg.MaxBatch-len(batch)-len(extra), express)...)
					extra = takeForFlush(extra)
					os := make([]core.Outcome, len(extra))
					for i, q := range extra {
						os[i] = q.o
					}
					batch = append(batch, extra...)
					limit = len(batch)
					return os
				}
			} else {
				claim = 0
				limit = max(1, limit/2)
			}
			outs := make([]core.Outcome, limit)
			for i, q := range batch[:limit] {
				outs[i] = q.o
			}
			return r.core.Flush(ctx, tx, outs, r.claimParams(claim), slow, &xact, more)
		})
		if tries > 1 && k > 0 {
			// The retries claimed nothing: the slots go back.
			r.unreserve(k)
			k = 0
		}
		if limit < len(batch) {
			// What the last try left out goes back to the head of the
			// queue, for the next flush.
			c.putBack(batch[limit:])
			batch = batch[:limit]
		}
		if err == nil {
			r.unreserve(k - len(res.Claimed))
			r.dispatch(res.Claimed)
			r.claimMu.RUnlock()
			deferred := make(map[int]bool, len(res.Deferred))
			var later []*queued
			for _, i := range res.Deferred {
				deferred[i] = true
				later = append(later, batch[i])
			}
			var applied []*queued
			for i, q := range batch {
				if !deferred[i] {
					q.res <- res.Results[i]
					applied = append(applied, q)
				}
			}
			c.requeue(later)
			r.core.AnnounceLog(batchConvs(applied)...)
			if fails := failedConvs(applied); len(fails) > 0 {
				// A failure may have tripped a fail_fast wait, whose abort of
				// the siblings this flush committed: their handlers here
				// are stopped now, not at the next notification.
				r.watch.check(fails...)
			}
			if len(res.Claimed) == k {
				// The slots ran out before the work may have: the
				// producer claims the rest when slots are free.
				r.markDirty(batchConvs(applied)...)
			}
			return
		}
		r.claimMu.RUnlock()
		switch {
		case errors.Is(err, arbortype.ErrAmbiguous) && xact == 0:
			continue // it locked nothing, so it wrote nothing: as if never tried
		case errors.Is(err, arbortype.ErrAmbiguous) && xact != 0:
			if c.resolve(ctx, batch, xact) {
				continue // rolled back: as if never tried
			}
			r.unreserve(k)
			return
		case !slow && !infrastructure(err):
			r.logger.Debug("arbor: a batched write was refused; applying the batch one outcome at a time",
				slog.Int("outcomes", len(batch)), slog.String("error", err.Error()))
			slow = true
			tries = 0 // a refusal is no fault: the next try is a first
			continue
		}
		r.unreserve(k)
		if !infrastructure(err) {
			r.logger.Warn("arbor: a batch of run outcomes failed", slog.Int("outcomes", len(batch)), slog.String("error", err.Error()))
		}
		for _, q := range batch {
			q.res <- core.OutcomeResult{Err: err}
		}
		return
	}
}

// takeForFlush marks the outcomes of qs as a flush's, and returns those it
// could: an outcome its caller withdrew (see apply) is left out, never
// written.
func takeForFlush(qs []*queued) []*queued {
	out := qs[:0]
	for _, q := range qs {
		if q.state.CompareAndSwap(queuedWaiting, queuedInFlush) {
			out = append(out, q)
		}
	}
	clear(qs[len(out):])
	return out
}

// putBack returns to the head of the queue, in order, outcomes a flush
// took and did not try, and has a flush take them.
func (c *completer) putBack(qs []*queued) {
	for _, q := range qs {
		q.state.Store(queuedWaiting)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = append(slices.Clone(qs), c.queue...)
	if c.flushing < c.r.cfg.Flushers {
		c.flushing++
		c.wg.Add(1)
		go c.flushLoop()
	}
}

// resolve settles a flush whose commit is unknown, by asking the database
// what became of its transaction (the answer waits for the transaction to
// end, if the server has not finished with it yet):
//
//   - rolled back: nothing was written; again is true and the batch is
//     flushed anew;
//   - committed: every outcome was applied (or refused) as one, or deferred
//     (its conversation locked). Each ending is checked against its task,
//     since after a failover the id may be another transaction's
//     (core.XactCommitted): one whose task is still running under its
//     run's token did not land (deferred, or the flush was not the one
//     that committed) and is queued again. A spawn is
//     written again by its own path, which its idempotency keys make return
//     the children it created; an ending write returns nil, or ErrAborted
//     for a task aborted meanwhile. What the transaction claimed is adopted
//     (see Runner.adopt);
//   - unknown still (the database stayed unavailable, or the runner is
//     stopping): every run gets ErrAmbiguous. Its handler's write is then
//     resolved by reading its task back; the claims of the flush, if it
//     committed, are adopted by the maintenance loop once the database
//     answers (Runner.unresolved).
func (c *completer) resolve(ctx context.Context, batch []*queued, xact int64) (again bool) {
	r := c.r
	committed, err := resolveXact(c.ctx, r, xact)
	if err != nil {
		r.logger.Warn("arbor: a batch's commit stayed unknown", slog.Int("outcomes", len(batch)), slog.String("error", err.Error()))
		r.unresolved.Store(true) // what it claimed, if it committed
		for _, q := range batch {
			q.res <- core.OutcomeResult{Err: err}
		}
		return false
	}
	if !committed {
		return true
	}
	landed := make([]bool, len(batch))
	var later []*queued
	for i, q := range batch {
		if q.o.Kind == core.OutSpawn {
			continue
		}
		done, err := resolveEnding(c.ctx, r.core, q.o)
		if err != nil {
			r.logger.Warn("arbor: a batch's commit could not be checked", slog.Int("outcomes", len(batch)), slog.String("error", err.Error()))
			r.unresolved.Store(true)
			for _, q := range batch {
				q.res <- core.OutcomeResult{Err: err}
			}
			return false
		}
		if landed[i] = done; !done {
			later = append(later, q)
		}
	}
	convs := map[string]bool{}
	for _, q := range batch {
		convs[q.o.ConversationID] = true
	}
	r.adopt(ctx, convs)
	d := directSink{r.core}
	for i, q := range batch {
		switch {
		case q.o.Kind == core.OutSpawn:
			q.res <- d.apply(ctx, q.run, q.o)
		case landed[i]:
			q.res <- core.OutcomeResult{Err: endedBy(ctx, r.core, q.o)}
		}
	}
	c.requeue(later)
	return false
}

// resolveXact waits until the database can say whether transaction xact
// committed, across outages, until ctx ends.
func resolveXact(ctx context.Context, r *Runner, xact int64) (bool, error) {
	for try := 0; ; try++ {
		committed, err := core.XactCommitted(ctx, r.core, xact)
		if err == nil || errors.Is(err, arbortype.ErrAmbiguous) {
			return committed, err
		}
		if !sleepCtx(ctx, faultWait(try)) {
			return false, errors.Join(arbortype.ErrAmbiguous, err)
		}
	}
}

// batchConvs lists the conversations of a batch's outcomes.
// failedConvs lists the conversations of the failures among qs.
func failedConvs(qs []*queued) []string {
	var out []string
	for _, q := range qs {
		if q.o.Kind == core.OutFail {
			out = append(out, q.o.ConversationID)
		}
	}
	return out
}

func batchConvs(batch []*queued) []string {
	convs := make([]string, len(batch))
	for i, q := range batch {
		convs[i] = q.o.ConversationID
	}
	return convs
}
