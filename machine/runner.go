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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
)

// Runner is a node's runner: it holds conversations by lease, claims their
// runnable tasks and runs their handlers (see the package doc).
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
	pools    runnerPools
	// runWith runs a dispatched run: execute, wrapped in the middleware;
	// execute itself without any.
	runWith func(ctx context.Context, run *Run)

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
	// liveIn counts, by conversation, the runs of runs and waiting: a
	// conversation is released only when it has none.
	liveIn map[string]int
	busy   int             // worker slots taken (running handlers, waiting runs, claims in flight)
	dirty  map[string]bool // held conversations that may have work to claim
	// flushingIn counts this node's flushes in flight per conversation;
	// afterFlush are held conversations a claim skipped while one of them
	// held it, to be claimed in once those flushes are over.
	flushingIn map[string]int
	afterFlush map[string]bool
	// outcomesAfter are outcomes a flush skipped because another flush of
	// this node held their conversation: queued again when it ends.
	outcomesAfter map[string][]*queued
	news          map[string]bool // conversations not held here that the change channel named
	wantHeld      bool            // any held conversation may have work (the slow poll)
	wantOpen      bool            // a conversation with no holder may have work
	wantReopen    bool            // lapsed conversations wait for a reopen
	started       bool
	stopping      bool
	// halted is set once Stop is done: a handler that outlived it can make
	// no call of arbor's any more (its connections are gone).
	halted atomic.Bool

	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	kick      chan struct{} // the producer's wake-up
	loops     sync.WaitGroup
	handlerWG sync.WaitGroup
	watch     *watchdog
}

// heldConv is what a runner keeps of a conversation it holds: a few words.
type heldConv struct {
	lease     core.Lease
	idleSince time.Time
	releasing bool
}

// active is a run of this node: running its handler, or waiting for the
// previous handler of its task to return.
type active struct {
	run     *Run
	token   int64
	kind    string
	conv    string
	epoch   int64 // the conversation's lease epoch the run was claimed under
	ctx     context.Context
	cancel  context.CancelCauseFunc
	warned  bool
	slot    bool // holds a worker slot (until its ending write is queued)
	started bool // its handler was called

	// cancelledAt is when its context was cancelled (zero: not yet);
	// stuckWarned when the watchdog last warned that it had not returned.
	cancelledAt time.Time
	stuckWarned time.Time
}

// stop cancels the run's context with cause, and notes when (under r.mu).
func (a *active) stop(cause error) {
	if a.cancelledAt.IsZero() {
		a.cancelledAt = time.Now()
	}
	a.cancel(cause)
}

// NewRunner returns a runner with a handler per task kind. It does not start
// anything, nor connect: Start does.
func NewRunner(engine *tasks.Engine, handlers map[string]Handler, cfg *RunnerConfig) (*Runner, error) {
	c := core.Of(engine)
	if c == nil {
		return nil, fmt.Errorf("machine.NewRunner: engine is nil: %w", tasks.ErrInvalidArgument)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w: %w", tasks.ErrInvalidArgument, err)
	}
	if len(handlers) == 0 {
		return nil, fmt.Errorf("machine.NewRunner: no handlers: %w", tasks.ErrInvalidArgument)
	}
	if err := cfg.Waker.WithDefaults().validate(); err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w: %w", tasks.ErrInvalidArgument, err)
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
		liveIn:        map[string]int{},
		dirty:         map[string]bool{},
		flushingIn:    map[string]int{},
		afterFlush:    map[string]bool{},
		outcomesAfter: map[string][]*queued{},
		news:          map[string]bool{},
		kick:          make(chan struct{}, 1),
	}
	for kind, h := range handlers {
		if kind == "" || h == nil {
			return nil, fmt.Errorf("machine.NewRunner: handler for kind %q is empty: %w", kind, tasks.ErrInvalidArgument)
		}
		r.kinds = append(r.kinds, kind)
	}
	slices.Sort(r.kinds)
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
	r.core = r.app.WithPool(pools.work)
	r.lease = newNodeLease(r.app.WithPool(pools.renew), r.cfg.NodeID, r.cfg.ConversationLease, r.logger)
	r.lease.onFire, r.lease.onConfirm = r.fenceFired, r.leaseConfirmed
	if err := r.lease.begin(ctx); err != nil {
		pools.close()
		return fmt.Errorf("machine: Runner.Start: taking the node's lease: %w", err)
	}
	if err := r.startWaker(ctx); err != nil {
		r.endHolder()
		pools.close()
		return fmt.Errorf("machine: Runner.Start: %w", err)
	}
	r.comp = newCompleter(r)
	r.watch = newWatchdog(r)
	r.started = true
	r.wantOpen, r.wantHeld = true, true
	r.runCtx, r.cancelRun = context.WithCancelCause(context.WithoutCancel(ctx))
	r.loops.Add(7)
	go func() { defer r.loops.Done(); r.lease.renewLoop(r.runCtx) }()
	go func() { defer r.loops.Done(); r.lease.fenceLoop(r.runCtx) }()
	go r.produce()
	go r.listenLoop()
	go r.watch.loop()
	go r.watch.checkLoop()
	go r.maintenanceLoop()
	r.poke()
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
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started || r.stopping {
		r.mu.Unlock()
		return nil
	}
	r.stopping = true
	r.mu.Unlock()

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
	r.releaseAll()
	r.cancelRun(ErrShutdown)
	r.loops.Wait()
	werr := r.waker.Stop(ctx)
	if stuck == nil {
		r.endHolder()
	}
	r.halted.Store(true)
	r.mu.Lock()
	r.held, r.lapsed = map[string]*heldConv{}, map[string]core.Lease{}
	r.mu.Unlock()
	r.pools.close()
	if werr != nil {
		return werr
	}
	return stuck
}

// endHolder removes the node's holder row once it holds nothing.
func (r *Runner) endHolder() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, _ := r.lease.holder()
	if _, err := core.Read(ctx, r.lease.core, func(db store.DB) (bool, error) { return r.lease.core.EndHolder(ctx, db, id) }); err != nil {
		r.logger.Debug("arbor: removing the node's holder row failed; it is removed once long expired", slog.String("error", err.Error()))
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

func (r *Runner) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// cancelAll cancels every running handler's context with cause.
func (r *Runner) cancelAll(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.runs {
		a.stop(cause)
	}
}

// reserve takes up to n free worker slots and returns how many it took.
func (r *Runner) reserve(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return 0
	}
	k := min(n, r.cfg.Workers-r.busy)
	if k < 0 {
		k = 0
	}
	r.busy += k
	return k
}

// unreserve gives back n reserved slots that a claim did not use.
func (r *Runner) unreserve(n int) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	r.busy -= n
	r.mu.Unlock()
	r.poke()
}

// dispatch starts the handlers of claimed tasks, each on a slot reserved
// for it.
//
//   - A run of a conversation this runner no longer holds at the run's
//     epoch (given up, lapsed) is not started: its task stays running until
//     recovery (a reopen, a release, the next holder) requeues it.
//   - Nor is any run while the node's lease is not usable (the fence is
//     due or fired): the fence fires, and the conversations are re-validated
//     before anything of theirs runs.
//   - A run of a task whose previous handler here has not returned waits
//     for it (see runDone).
func (r *Runner) dispatch(claimed []arbortype.Task) {
	if len(claimed) == 0 {
		return
	}
	now := time.Now()
	var start []*active
	fire := false
	r.mu.Lock()
	usable := r.lease.usable(now)
	for _, t := range claimed {
		h := r.held[t.ConversationID]
		if !usable || h == nil || h.lease.Epoch != t.Epoch {
			r.busy--
			fire = fire || !usable
			continue
		}
		a := r.newActive(t)
		r.liveIn[t.ConversationID]++
		if r.runs[t.ID] != nil {
			if old := r.waiting[t.ID]; old != nil {
				r.drop(old) // claimed before this one: its token is dead
			}
			r.waiting[t.ID] = a
			continue
		}
		r.runs[t.ID] = a
		start = append(start, a)
	}
	r.mu.Unlock()
	if fire {
		r.lease.fire()
	}
	for _, a := range start {
		r.start(a)
	}
}

// newActive makes a run's bookkeeping and context (under r.mu).
func (r *Runner) newActive(t arbortype.Task) *active {
	inner, cancel := context.WithCancelCause(r.runCtx)
	run := newRun(r.core, r.comp, t)
	run.halted = &r.halted
	return &active{run: run, token: t.Token, kind: t.Kind, conv: t.ConversationID, epoch: t.Epoch,
		ctx: fencedCtx{Context: inner, lease: r.lease}, cancel: cancel, slot: true}
}

// drop forgets a run that will not be started, with its slot (under r.mu).
func (r *Runner) drop(a *active) {
	if a.slot {
		a.slot = false
		r.busy--
	}
	r.liveDone(a.conv)
	a.cancel(context.Canceled)
}

// liveDone counts a run of conv over (under r.mu).
func (r *Runner) liveDone(conv string) {
	if r.liveIn[conv]--; r.liveIn[conv] <= 0 {
		delete(r.liveIn, conv)
		if h := r.held[conv]; h != nil {
			h.idleSince = time.Now()
		}
	}
}

// start runs a's handler on a goroutine of its own.
func (r *Runner) start(a *active) {
	r.handlerWG.Add(1)
	go func() {
		defer r.handlerWG.Done()
		// A run whose context was cancelled before it began (the fence
		// fired, the task was stopped) does not call its handler.
		if a.ctx.Err() == nil {
			r.mu.Lock()
			a.started = true
			r.mu.Unlock()
			r.run(a.ctx, a.run)
		}
		a.cancel(context.Canceled)
		r.runDone(a)
	}()
}

// run runs a dispatched run through the middleware, and reports its end to
// the observer.
func (r *Runner) run(ctx context.Context, run *Run) {
	var started time.Time
	if r.cfg.Observer != nil {
		started = time.Now()
	}
	r.runWith(ctx, run)
	if r.cfg.Observer != nil {
		r.cfg.Observer.Observe(Observation{Kind: ObservedRunEnded, Task: &run.Task, Outcome: run.Outcome(),
			Started: started, Ended: time.Now()})
	}
}

// runDone forgets a handler that returned: its entry in runs, its worker
// slot if it still holds one, and its count in its conversation; and
// starts the run of its task that waited for it, if there is one and the
// node may still run it (the flush that applied this run's ending write
// may have made the task runnable again and claimed it before this handler
// returned: an await whose event was waiting, a wait already satisfied).
func (r *Runner) runDone(a *active) {
	id := a.run.id
	var next *active
	r.mu.Lock()
	if r.runs[id] == a {
		delete(r.runs, id)
	}
	if a.slot {
		a.slot = false
		r.busy--
	}
	r.liveDone(a.conv)
	if w := r.waiting[id]; w != nil {
		delete(r.waiting, id)
		h := r.held[w.conv]
		if h != nil && h.lease.Epoch == w.epoch && r.lease.usable(time.Now()) {
			r.runs[id] = w
			next = w
		} else {
			r.drop(w)
		}
	}
	r.mu.Unlock()
	if next != nil {
		r.start(next)
	}
	r.poke() // a slot is free: the producer may have work waiting for one
}

// ending gives a run's worker slot back when it queues its ending write
// (the completer's flush may hand it to the work that write creates).
func (r *Runner) ending(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.id]; a != nil && a.run == run && a.slot {
		a.slot = false
		r.busy--
	}
	r.mu.Unlock()
}

// retake gives a run whose ending write was cut off its worker slot again,
// before its handler is called again.
func (r *Runner) retake(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.id]; a != nil && a.run == run && !a.slot {
		a.slot = true
		r.busy++
	}
	r.mu.Unlock()
}

// wakeAndClaim is a timer's wake on this node: the sleep ended and, when
// this node holds the conversation and may act, the conversation's
// runnable work claimed (the woken task first among it, oldest first) in
// the same transaction and dispatched at once — no notification and no
// producer between a sleep's time and its handler. A wake whose commit's
// answer was lost is resolved like a claim's (adopt).
func (r *Runner) wakeAndClaim(ctx context.Context, taskID, sleepSeq int64, conv string) (bool, error) {
	r.mu.Lock()
	h := r.held[conv]
	r.mu.Unlock()
	k := 0
	if h != nil && r.lease.usable(time.Now()) {
		k = r.reserve(1)
	}
	var (
		claimed []arbortype.Task
		xact    int64
	)
	r.claimMu.RLock()
	woken, err := core.Tx(ctx, r.core, func(tx pgx.Tx) (bool, error) {
		claimed = nil
		woken, err := r.core.WakeSleeping(ctx, tx, taskID, sleepSeq)
		if err != nil || !woken || k == 0 {
			return woken, err
		}
		p := r.claimParams(k)
		p.Conversations = []string{conv}
		claimed, xact, err = r.core.ClaimFor(ctx, tx, p)
		return woken, err
	})
	if err != nil {
		r.claimMu.RUnlock()
		r.unreserve(k)
		if errors.Is(err, tasks.ErrAmbiguous) && xact != 0 {
			go r.claimFailed(err, xact, "waking a sleep")
		}
		return woken, err
	}
	r.unreserve(k - len(claimed))
	r.dispatch(claimed)
	r.claimMu.RUnlock()
	r.announceRuns(claimed)
	return woken, nil
}

// stopRuns cancels, with cause, the runs here of the tasks among ids
// (holding the token given, same index; 0: any).
func (r *Runner) stopRuns(ids, tokens []int64, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range ids {
		if a := r.runs[id]; a != nil && (tokens[i] == 0 || a.token == tokens[i]) && !a.run.endingOrEnded() {
			a.stop(cause)
		}
	}
}

// adopt starts the runs that a transaction whose commit's answer was lost
// claimed: running tasks of the conversations (nil: every one the node's
// life holds, its leases read back too) under this node's current epoch
// that no handler here runs. It write-holds claimMu, so no claim of the
// runner's own is between its commit and its dispatch meanwhile. A read
// that fails sets unresolved, so the maintenance loop adopts again.
func (r *Runner) adopt(ctx context.Context, convs map[string]bool) {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	if convs == nil {
		holderID, _ := r.lease.holder()
		leases, err := core.Read(ctx, r.core, func(db store.DB) ([]core.Lease, error) {
			return r.core.HeldBy(ctx, db, r.cfg.NodeID, holderID)
		})
		if err != nil {
			r.logger.Warn("arbor: reading back this node's leases failed; those it took unawares are adopted once the database answers",
				slog.String("error", err.Error()))
			r.unresolved.Store(true)
			return
		}
		now := time.Now()
		convs = make(map[string]bool, len(leases))
		r.mu.Lock()
		for _, l := range leases {
			if _, lapsed := r.lapsed[l.ConversationID]; lapsed {
				continue // re-validated by a reopen
			}
			r.hold(l, now)
			convs[l.ConversationID] = true
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	ids := make([]string, 0, len(convs))
	for id := range convs {
		if h := r.held[id]; h != nil && !h.releasing {
			ids = append(ids, id)
		}
	}
	stopping := r.stopping
	r.mu.Unlock()
	if len(ids) == 0 || stopping {
		return
	}
	running, err := core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.RunningIn(ctx, db, ids) })
	if err != nil {
		r.logger.Warn("arbor: reading back the runs of a commit whose answer was lost failed; they are adopted once the database answers",
			slog.String("error", err.Error()))
		r.unresolved.Store(true)
		return
	}
	var orphans []arbortype.Task
	r.mu.Lock()
	for _, t := range running {
		if h := r.held[t.ConversationID]; h != nil && r.runs[t.ID] == nil && r.waiting[t.ID] == nil && t.Epoch == h.lease.Epoch {
			orphans = append(orphans, t)
		}
	}
	r.busy += len(orphans)
	r.mu.Unlock()
	if len(orphans) > 0 {
		r.logger.Info("arbor: adopted runs claimed by a commit whose answer was lost", slog.Int("runs", len(orphans)))
	}
	r.dispatch(orphans)
}

// markDirty says that the held conversations convs may have work (one
// released meanwhile is news for the producer to open); markHeld
// that any held one may; markOpen that an unheld one may.
func (r *Runner) markDirty(convs ...string) {
	r.mu.Lock()
	for _, c := range convs {
		switch {
		case r.held[c] != nil:
			r.dirty[c] = true
		case len(r.news) < maxNews:
			r.news[c] = true // released meanwhile: news of an unheld one
		default:
			r.wantOpen = true
		}
	}
	r.mu.Unlock()
	r.poke()
}

func (r *Runner) markHeld() {
	r.mu.Lock()
	r.wantHeld = true
	r.mu.Unlock()
	r.poke()
}

// maxNews bounds the conversations the change channel named that wait to
// be looked at; past it, the producer scans for them instead.
const maxNews = 100_000

func (r *Runner) markNews(conv string) {
	r.mu.Lock()
	if len(r.news) < maxNews {
		r.news[conv] = true
	} else {
		r.wantOpen = true
	}
	r.mu.Unlock()
	r.poke()
}

func (r *Runner) markOpen() {
	r.mu.Lock()
	r.wantOpen = true
	r.mu.Unlock()
	r.poke()
}

// listenLoop hears the change channel: a held conversation's change may be
// new work, or a run stopped elsewhere (the watchdog checks its handlers);
// an unheld one's is work for the producer to open. What changed while it
// was not listening is found by polling at once.
//
// Behind a transaction-mode pooler with no ListenPool there is nothing to
// LISTEN on: the slow poll (PollInterval) finds the news instead.
func (r *Runner) listenLoop() {
	defer r.loops.Done()
	pool := r.core.Listener()
	if pool == nil {
		return
	}
	listen(r.runCtx, pool, r.core.Store.ChangeChannel(), r.logger,
		func() {
			r.markOpen()
			r.markHeld()
		},
		func(n *pgconn.Notification) {
			r.mu.Lock()
			_, held := r.held[n.Payload]
			r.mu.Unlock()
			if held {
				r.markDirty(n.Payload)
				r.watch.check(n.Payload)
			} else {
				r.markNews(n.Payload)
			}
		})
}

// runnerPools are a runner's own connections: work for the producer, the
// completer, maintenance, the wake service and the handlers' calls (the
// configured RunnerConfig.Pool, or one made from the engine pool's
// configuration); renew, one connection kept open for the lease's renewer
// alone; control for the watchdog's reads. The renewer waits behind
// nothing, not even the watchdog.
type runnerPools struct {
	work, renew, control *pgxpool.Pool
	ownWork              bool
}

func newRunnerPools(ctx context.Context, c *core.Engine, cfg *RunnerConfig) (runnerPools, error) {
	var p runnerPools
	base := c.Pool.Config()
	if cfg.Pool != nil {
		p.work = cfg.Pool
		base = cfg.Pool.Config()
	} else {
		wc := base.Copy()
		wc.MaxConns, wc.MinConns = int32(cfg.Flushers+1+WorkPoolExtraConns), 0 // + the completer's express lane
		pool, err := pgxpool.NewWithConfig(ctx, wc)
		if err != nil {
			return p, fmt.Errorf("the runner's pool: %w", err)
		}
		p.work, p.ownWork = pool, true
	}
	rc := base.Copy()
	rc.MaxConns, rc.MinConns = 1, 1
	renew, err := pgxpool.NewWithConfig(ctx, rc)
	if err != nil {
		p.close()
		return p, fmt.Errorf("the runner's renewal connection: %w", err)
	}
	p.renew = renew
	cc := base.Copy()
	cc.MaxConns, cc.MinConns = 1, 0
	control, err := pgxpool.NewWithConfig(ctx, cc)
	if err != nil {
		p.close()
		return p, fmt.Errorf("the runner's control pool: %w", err)
	}
	p.control = control
	return p, nil
}

func (p runnerPools) close() {
	if p.ownWork && p.work != nil {
		p.work.Close()
	}
	for _, pool := range []*pgxpool.Pool{p.renew, p.control} {
		if pool != nil {
			pool.Close()
		}
	}
}
