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

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
)

// Runner is a node's runner: it holds conversations by lease, claims their
// runnable tasks and runs their handlers (see docs/architecture.md,
// "Inside the runner").
type Runner struct {
	app      *core.Engine // the engine as the application made it (its pool)
	core     *core.Engine // the same engine on the runner's own pool (Start)
	cfg      *RunnerConfig
	logger   *slog.Logger
	handlers map[string]Handler
	kinds    []string
	waker    *Waker
	comp     *completer
	lease    *nodeLease
	life     *lifeLock // nil: life locks off
	pools    runnerPools
	// runWith runs a dispatched run: execute, wrapped in the middleware;
	// execute itself without any.
	runWith func(ctx context.Context, run *Run)

	// reconcileMu makes the calls of cfg.OnReconcile one at a time: the
	// producer's opens and the creates that take conversations (start.go)
	// both report.
	reconcileMu sync.Mutex
	// claimMu is read-held by every transaction that claims runs or takes
	// leases, until their bookkeeping here is done; adopt write-holds it,
	// so that what it finds in the database and not here is an orphan.
	claimMu sync.RWMutex
	// unresolved is set when a commit that may have claimed runs stayed
	// unknown, or the runs it claimed could not be read back: the
	// maintenance loop adopts what the node holds, each PollInterval,
	// until it could (a conversation with a run nobody runs is never idle,
	// so a release would never recover it).
	unresolved atomic.Bool

	mu   sync.Mutex
	held map[string]*heldConv // by conversation id
	// openAfter is the tenant the next scanning open starts from (see
	// core.Opened.NextAfter).
	openAfter *string
	// lapsed are the conversations this life holds in the database whose
	// handlers the fence stopped: re-validated by a reopen once the lease
	// is confirmed again (see lapse.go).
	lapsed map[string]core.Lease
	// runs are the live handlers, by task id: from the handler's entry to
	// its return, whatever became of its task or its conversation's lease.
	runs map[int64]*active
	// waiting are runs claimed for a task whose previous handler here has
	// not returned yet: dispatched when it does.
	waiting map[int64]*active
	// unstarted are the runs this node claimed whose handlers it has not
	// entered, by token (unstarted.go): a recovery of this node requeues
	// them, whatever their kind.
	unstarted map[int64]unstartedRun
	// liveIn counts, by conversation, the runs of runs and waiting: a
	// conversation is released only when it has none.
	liveIn map[string]int
	busy   int // worker slots taken (running handlers, waiting runs, claims in flight)
	// claiming is the part of busy the producer's claims and opens in
	// flight reserved (reserveForClaim), before they know what they find;
	// claimEnd is closed (and replaced) when one of them ends.
	claiming int
	claimEnd chan struct{}
	// flushingIn counts this node's flushes in flight per conversation;
	// afterFlush are held conversations a claim skipped while one of them
	// held it, to be claimed in once those flushes are over.
	flushingIn map[string]int
	afterFlush map[string]bool
	// outcomesAfter are outcomes a flush skipped because another flush of
	// this node held their conversation: queued again when it ends.
	outcomesAfter map[string][]*queued
	// queuedLate counts, by token, the outcomes still queued in the
	// completer whose caller stopped waiting (its context ended): they land
	// or are refused by their token later, and until then the audit does
	// not take their task for lost, though the run may be gone from runs.
	queuedLate map[int64]int
	started    bool
	stopping   bool
	// testClaimed, set by a test (under mu), is called inside every claim's
	// transaction with what it claimed, before it commits: a test holds a
	// claim in flight with it. Nil outside tests.
	testClaimed func(runs []arbortype.Task)
	// testMaintained, set by a test before Start, is called at the end of
	// each PollInterval's maintenance tick with whether this runner led it
	// (maintainer.scanned). Nil outside tests.
	testMaintained func(led bool)
	// stopAtBarrier is set when Stop waits for the claims in flight, before
	// the release (a test's signal).
	stopAtBarrier atomic.Bool
	// stopDone is closed when the first Stop has ended, with its result
	// in stopErr (written before the close).
	stopDone chan struct{}
	stopErr  error
	// halted is set once Stop is done: a handler that outlived it can make
	// no call of arbor's any more (its connections are gone).
	halted atomic.Bool

	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	loops     sync.WaitGroup
	handlerWG sync.WaitGroup
	watch     *watchdog
	entries   *entryCheck
	prod      *producer
}

// heldConv is what a runner keeps of a conversation it holds: a few words.
type heldConv struct {
	lease     core.Lease
	idleSince time.Time
	releasing bool
}

// NewRunner returns a runner with a handler per task kind. It does not start
// anything, nor connect: Start does.
func NewRunner(engine *tasks.Engine, handlers map[string]Handler, cfg *RunnerConfig) (*Runner, error) {
	c := core.Of(engine)
	if c == nil {
		return nil, fmt.Errorf("machine.NewRunner: engine is nil: %w", arbortype.ErrInvalidArgument)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w: %w", arbortype.ErrInvalidArgument, err)
	}
	if len(handlers) == 0 {
		return nil, fmt.Errorf("machine.NewRunner: no handlers: %w", arbortype.ErrInvalidArgument)
	}
	if err := cfg.Waker.WithDefaults().validate(); err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w: %w", arbortype.ErrInvalidArgument, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = c.Logger
	}
	r := &Runner{
		app:           c,
		cfg:           cfg,
		logger:        cfg.Logger.With(slog.String("node", cfg.NodeID)),
		handlers:      handlers,
		held:          map[string]*heldConv{},
		lapsed:        map[string]core.Lease{},
		runs:          map[int64]*active{},
		waiting:       map[int64]*active{},
		unstarted:     map[int64]unstartedRun{},
		queuedLate:    map[int64]int{},
		liveIn:        map[string]int{},
		claimEnd:      make(chan struct{}),
		flushingIn:    map[string]int{},
		afterFlush:    map[string]bool{},
		outcomesAfter: map[string][]*queued{},
	}
	for kind, h := range handlers {
		if kind == "" || h == nil {
			return nil, fmt.Errorf("machine.NewRunner: handler for kind %q is empty: %w", kind, arbortype.ErrInvalidArgument)
		}
		r.kinds = append(r.kinds, kind)
	}
	slices.Sort(r.kinds)
	r.prod = newProducer(r)
	r.runWith = func(ctx context.Context, run *Run) {
		r.execute(ctx, run)
		run.noteStop(ctx)
	}
	for i := len(cfg.Middleware) - 1; i >= 0; i-- {
		m, inner := cfg.Middleware[i], r.runWith
		r.runWith = func(ctx context.Context, run *Run) {
			m.Run(ctx, run, func(ctx context.Context) Outcome {
				inner(ctx, run)
				return run.Outcome()
			})
		}
	}
	return r, nil
}

// NodeID returns the name this runner holds conversations under.
func (r *Runner) NodeID() string { return r.cfg.NodeID }

// Start connects the runner's own pools, takes the node's lease (a holder
// row of its own), and starts the wake service and the runner's services.
// ctx bounds the start only; Stop ends the runner.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("machine: Runner.Start: a runner starts once")
	}
	pools, err := newRunnerPools(ctx, r.app, r.cfg)
	if err != nil {
		return fmt.Errorf("machine: Runner.Start: %w", err)
	}
	r.pools = pools
	r.core = r.app.WithPool(pools.work).WithAnnouncePool(pools.announce)
	r.lease = newNodeLease(r.app.WithPool(pools.renew), r.cfg.NodeID, r.cfg.ConversationLease, r.logger)
	r.lease.onFire, r.lease.onConfirm = r.fenceFired, r.leaseConfirmed
	r.startLife(ctx)
	if err := r.lease.begin(ctx); err != nil {
		pools.close()
		return fmt.Errorf("machine: Runner.Start: taking the node's lease: %w", err)
	}
	if err := r.startWaker(ctx); err != nil {
		r.endLife(r.endHolder())
		pools.close()
		return fmt.Errorf("machine: Runner.Start: %w", err)
	}
	r.comp = newCompleter(r)
	r.watch = newWatchdog(r)
	r.entries = newEntryCheck(r)
	r.started = true
	r.runCtx, r.cancelRun = context.WithCancelCause(context.WithoutCancel(ctx))
	// Every loop of the runner's starts here, and Stop waits for them all.
	r.loops.Go(func() { r.lease.renewLoop(r.runCtx) })
	r.loops.Go(func() { r.lease.fenceLoop(r.runCtx) })
	r.loops.Go(func() { r.prod.run(r.runCtx) })
	r.loops.Go(r.listenLoop)
	r.loops.Go(r.watch.loop)
	r.loops.Go(r.watch.checkLoop)
	r.loops.Go(r.entries.loop)
	r.loops.Go(func() { newMaintainer(r).run(r.runCtx) })
	// A root Create of this process may now start its task here (start.go).
	r.app.AddStarter(starter{r})
	r.loops.Go(r.lifeLoop)
	r.prod.poke()
	return nil
}

// startWaker builds and starts the wake service on the runner's pool.
func (r *Runner) startWaker(ctx context.Context) error {
	wcfg := r.cfg.Waker.WithDefaults()
	if wcfg.Logger == nil {
		wcfg.Logger = r.cfg.Logger
	}
	if obs := r.cfg.Observer; obs != nil {
		onWake := wcfg.OnWake
		wcfg.OnWake = func(e Wake) {
			obs.Observe(Observation{Kind: ObservedWake, Wake: e})
			if onWake != nil {
				onWake(e)
			}
		}
	}
	waker, err := newWaker(r.core, wcfg)
	if err != nil {
		return err
	}
	waker.wake = r.wakeAndClaim
	if err := waker.Start(ctx); err != nil {
		return err
	}
	r.waker = waker
	return nil
}

// Stop stops claiming, lets running handlers finish for ShutdownGrace, then
// cancels the rest, flushes the completer, releases every conversation
// with no handler left running (recovering any task still running, not
// counted as a restart), stops the wake service, and gives up the node's
// lease. A conversation whose handler ignored its cancelled context is not
// released: it lapses with the lease, so that no other node runs its task
// while that handler runs here. ctx bounds the wait for handlers: when it
// ends first, they are cancelled at once.
//
// A transaction that was claiming when Stop began commits before the drain,
// and none of the runs it claimed is started: they stay unstarted, and the
// release requeues them without counting a restart. A second Stop, or one
// called at the same time, waits for the first to end and returns its
// result (or ctx's error, when ctx ends first).
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	if r.stopping {
		done := r.stopDone
		r.mu.Unlock()
		select {
		case <-done:
			return r.stopErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.stopping = true
	r.stopDone = make(chan struct{})
	r.mu.Unlock()
	r.stopErr = r.stop(ctx)
	close(r.stopDone)
	return r.stopErr
}

// stop is the first Stop's work.
func (r *Runner) stop(ctx context.Context) error {
	drained := make(chan struct{})
	go func() { r.handlerWG.Wait(); close(drained) }()
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-drained:
	case <-grace.C:
		r.logger.WarnContext(ctx, "arbor: shutdown grace over; cancelling running handlers")
		r.cancelAll(ErrShutdown)
	case <-ctx.Done():
		r.cancelAll(ErrShutdown)
	}
	// Cancelled handlers get a moment to return, whatever ctx says.
	late := time.NewTimer(time.Second)
	defer late.Stop()
	select {
	case <-drained:
	case <-late.C:
	}
	var stuck error
	select {
	case <-drained:
	default:
		r.mu.Lock()
		var ids []int64
		for id, a := range r.runs {
			if a.started {
				ids = append(ids, id)
			}
		}
		r.mu.Unlock()
		slices.Sort(ids)
		stuck = fmt.Errorf("machine: Runner.Stop: the handlers of tasks %v ignored their cancelled context; their conversations were not released, and lapse with the node's lease", ids)
	}
	// Every queued outcome is written before the leases go.
	r.comp.stop()
	// Every claim read-holds claimMu from its transaction's start to its
	// dispatch, and reserve gives no slot once stopping is set: once the
	// write lock is had, no claim is in flight and none starts after, so
	// none commits after the release. What the last ones claimed was not
	// started (dispatch, stopping): the release requeues it, uncounted.
	r.app.RemoveStarter(starter{r})
	r.stopAtBarrier.Store(true)
	r.claimMu.Lock()
	//lint:ignore SA2001 the lock is a barrier: it waits for the claims in flight
	r.claimMu.Unlock()
	r.releaseAll()
	r.cancelRun(ErrShutdown)
	r.loops.Wait()
	werr := r.waker.Stop(ctx)
	r.endLife(stuck == nil && r.endHolder())
	r.halted.Store(true)
	r.mu.Lock()
	r.held, r.lapsed = map[string]*heldConv{}, map[string]core.Lease{}
	r.unstarted = map[int64]unstartedRun{}
	r.mu.Unlock()
	r.pools.close()
	if werr != nil {
		return werr
	}
	return stuck
}

// endHolder removes the node's holder row once it holds nothing, and
// reports whether it did.
func (r *Runner) endHolder() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, _ := r.lease.holder()
	ended, err := core.Read(ctx, r.lease.core, func(db store.DB) (bool, error) { return r.lease.core.EndHolder(ctx, db, id) })
	if err != nil {
		r.logger.Debug("arbor: removing the node's holder row failed; it is removed once long expired", slog.String("error", err.Error()))
	}
	return ended
}

// endLife drops the life's lock file when its row is gone (ended); else
// keeps it locked until the process exits: the row may still hold
// conversations, left to lapse, and no runner may prove this life dead
// while this process lives.
func (r *Runner) endLife(ended bool) {
	if r.life == nil {
		return
	}
	if ended {
		r.life.release()
	} else {
		r.life.keep()
	}
}

// Held returns the conversations this runner holds now.
func (r *Runner) Held() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.held))
	for id := range r.held {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// cancelAll cancels every running handler's context with cause.
func (r *Runner) cancelAll(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.runs {
		a.stop(cause)
	}
}
