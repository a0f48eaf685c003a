package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/store"
	"github.com/arborhq/arbor/tasks"
)

// Runner is a node's runner: it holds conversations by lease, claims their
// runnable tasks and runs their handlers (see the package doc).
type Runner struct {
	core     *core.Engine
	cfg      *RunnerConfig
	logger   *slog.Logger
	handlers map[string]Handler
	kinds    []string
	waker    *Waker
	comp     *completer
	// runWith runs a dispatched run: execute, wrapped in the middleware;
	// execute itself without any.
	runWith func(ctx context.Context, run *Run)

	// claimMu is read-held by every transaction that claims runs or takes
	// leases, until their bookkeeping here is done; adopt write-holds it,
	// so that what it finds in the database and not here is an orphan.
	claimMu sync.RWMutex

	mu    sync.Mutex
	held  map[string]*heldConv // by conversation id
	runs  map[int64]*active    // by task id
	busy  int                  // worker slots taken (running handlers, and claims in flight)
	dirty map[string]bool      // held conversations that may have work to claim
	// flushingIn counts this node's flushes in flight per conversation;
	// afterFlush are held conversations a claim skipped while one of them
	// held it, to be claimed in once those flushes are over.
	flushingIn map[string]int
	afterFlush map[string]bool
	news       map[string]bool   // conversations not held here that the change channel named
	gaveUp     map[string]gaveUp // conversations given up by fenceOverdue, not to be adopted back
	wantHeld   bool              // any held conversation may have work (the slow poll)
	wantOpen   bool              // a conversation with no holder may have work
	started    bool
	stopping   bool

	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	kick      chan struct{} // the producer's wake-up
	loops     sync.WaitGroup
	handlerWG sync.WaitGroup
}

// heldConv is what a runner keeps of a conversation it holds: a few words.
type heldConv struct {
	lease     core.Lease
	running   int
	idleSince time.Time
	releasing bool
	// confirmed is the local time until which the lease surely lasts: the
	// send time of the last statement that set it, plus the lease. The
	// database's deadline is no earlier (it counts from when the statement
	// ran), so a runner that stops its handlers before confirmed has them
	// stopped before any other node can take the conversation.
	confirmed time.Time
}

// gaveUp is a lease fenceOverdue gave up: the database may still name this
// node its holder until it expires, but its runs were stopped, so it must
// not be adopted back (its next holder recovers them).
type gaveUp struct {
	epoch int64
	at    time.Time
}

// active is a running handler.
type active struct {
	run    *Run
	token  int64
	kind   string
	conv   string
	epoch  int64 // the conversation's lease epoch the run was claimed under
	cancel context.CancelCauseFunc
	warned bool
	slot   bool // holds a worker slot (until its ending write is queued)
}

// NewRunner returns a runner with a handler per task kind. It does not start
// anything.
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
	if cfg.Logger == nil {
		cfg.Logger = c.Logger
	}
	r := &Runner{
		core:       c,
		cfg:        cfg,
		logger:     cfg.Logger.With(slog.String("node", cfg.NodeID)),
		handlers:   handlers,
		held:       map[string]*heldConv{},
		runs:       map[int64]*active{},
		dirty:      map[string]bool{},
		flushingIn: map[string]int{},
		afterFlush: map[string]bool{},
		news:       map[string]bool{},
		gaveUp:     map[string]gaveUp{},
		kick:       make(chan struct{}, 1),
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
	wcfg := cfg.Waker.WithDefaults()
	if wcfg.Logger == nil {
		wcfg.Logger = cfg.Logger
	}
	if obs := cfg.Observer; obs != nil {
		onWake := wcfg.OnWake
		wcfg.OnWake = func(e WakeEvent) {
			obs.Observe(Event{Kind: EventWoken, Wake: e})
			if onWake != nil {
				onWake(e)
			}
		}
	}
	waker, err := NewWaker(engine, wcfg)
	if err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w", err)
	}
	r.waker = waker
	r.comp = newCompleter(r)
	return r, nil
}

// NodeID returns the name this runner holds conversations under.
func (r *Runner) NodeID() string { return r.cfg.NodeID }

// Start starts the wake service and the runner's loops. ctx bounds the
// start only; Stop ends the runner.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("machine: Runner.Start: a runner starts once")
	}
	if err := r.waker.Start(ctx); err != nil {
		return fmt.Errorf("machine: Runner.Start: %w", err)
	}
	r.started = true
	r.wantOpen, r.wantHeld = true, true
	r.runCtx, r.cancelRun = context.WithCancelCause(context.WithoutCancel(ctx))
	r.loops.Add(5)
	go r.produce()
	go r.renewLoop()
	go r.listenLoop()
	go r.watchLoop()
	go r.maintenanceLoop()
	r.poke()
	return nil
}

// Stop stops claiming, lets running handlers finish for ShutdownGrace, then
// cancels the rest, flushes the completer, releases every conversation
// (recovering any task still running) and stops the wake service. ctx
// bounds the wait for handlers: when it ends first, they are cancelled at
// once.
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
		n := len(r.runs)
		r.mu.Unlock()
		stuck = fmt.Errorf("machine: Runner.Stop: %d handlers ignored their cancelled context; their conversations were released and their tasks recovered", n)
	}
	// Every queued outcome is written before the leases go.
	r.comp.stop()
	r.cancelRun(ErrShutdown)
	r.loops.Wait()
	r.releaseAll()
	if err := r.waker.Stop(ctx); err != nil {
		return err
	}
	return stuck
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
		a.cancel(cause)
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
// A run claimed in a conversation this runner no longer counts as held (it
// stopped it for a lease it could not confirm in time, see fenceOverdue)
// is not started: its task stays running until the conversation's next
// holder recovers it, so that no handler runs past the lease.
func (r *Runner) dispatch(claimed []arbortype.Task) {
	for _, t := range claimed {
		ctx, cancel := context.WithCancelCause(r.runCtx)
		run := newRun(r.core, r.comp, t)
		a := &active{run: run, token: t.Token, kind: t.Kind, conv: t.ConversationID, epoch: t.Epoch, cancel: cancel, slot: true}
		r.mu.Lock()
		h := r.held[t.ConversationID]
		if h == nil || h.lease.Epoch != t.Epoch {
			r.busy--
			r.mu.Unlock()
			cancel(errConversationLost)
			continue
		}
		r.runs[t.ID] = a
		h.running++
		r.mu.Unlock()
		r.handlerWG.Add(1)
		go func() {
			defer r.handlerWG.Done()
			r.run(ctx, run)
			cancel(context.Canceled)
			r.runDone(t.ID, a)
		}()
	}
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
		r.cfg.Observer.Observe(Event{Kind: EventRunEnded, Task: &run.Task, Outcome: run.Outcome(),
			Started: started, Ended: time.Now()})
	}
}

// ending gives a run's worker slot back when it queues its ending write
// (the completer's flush may hand it to the work that write creates).
func (r *Runner) ending(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.Task.ID]; a != nil && a.run == run && a.slot {
		a.slot = false
		r.busy--
	}
	r.mu.Unlock()
}

// retake gives a run whose ending write was cut off its worker slot again,
// before its handler is called again.
func (r *Runner) retake(run *Run) {
	r.mu.Lock()
	if a := r.runs[run.Task.ID]; a != nil && a.run == run && !a.slot {
		a.slot = true
		r.busy++
	}
	r.mu.Unlock()
}

// adopt starts the runs that a transaction whose commit's answer was lost
// claimed: running tasks of the conversations (nil: every one the node
// holds, its leases read back too) under this node's current epoch that no
// handler here runs. It write-holds claimMu, so no claim of the runner's
// own is between its commit and its dispatch meanwhile.
func (r *Runner) adopt(ctx context.Context, convs map[string]bool) {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	if convs == nil {
		leases, err := core.Read(ctx, r.core, func(db store.DB) ([]core.Lease, error) { return r.core.HeldBy(ctx, db, r.cfg.NodeID) })
		if err != nil {
			r.logger.Warn("arbor: reading back this node's leases failed; those it took unawares expire", slog.String("error", err.Error()))
			return
		}
		now := time.Now()
		convs = make(map[string]bool, len(leases))
		r.mu.Lock()
		for _, l := range leases {
			if g, ok := r.gaveUp[l.ConversationID]; ok && g.epoch == l.Epoch {
				continue
			}
			if r.held[l.ConversationID] == nil {
				// Renewed at the next round; until then confirmed by the
				// read, which ran after now.
				r.held[l.ConversationID] = &heldConv{lease: l, idleSince: now, confirmed: now.Add(r.cfg.ConversationLease / 2)}
			}
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
		r.logger.Warn("arbor: reading back the runs of a commit whose answer was lost failed; they are recovered at release",
			slog.String("error", err.Error()))
		return
	}
	var orphans []arbortype.Task
	r.mu.Lock()
	for _, t := range running {
		if h := r.held[t.ConversationID]; h != nil && r.runs[t.ID] == nil && t.Epoch == h.lease.Epoch {
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

// runDone forgets a handler that returned: its entry in runs, its worker
// slot if it still holds one, and its count in its conversation. The entry
// may be a later run's of the same task already — the flush that applied
// this run's ending write can make the task runnable again and claim it
// (an await whose event was waiting, a wait already satisfied) before this
// handler has returned — and is then left to that run; the count is this
// run's either way, when the conversation is still held under the lease
// it was claimed under.
func (r *Runner) runDone(taskID int64, a *active) {
	r.mu.Lock()
	if r.runs[taskID] == a {
		delete(r.runs, taskID)
	}
	if a.slot {
		a.slot = false
		r.busy--
	}
	if h := r.held[a.conv]; h != nil && h.lease.Epoch == a.epoch {
		h.running--
		if h.running == 0 {
			h.idleSince = time.Now()
		}
	}
	r.mu.Unlock()
	r.poke() // a slot is free: the producer may have work waiting for one
}

// markDirty says that the held conversations convs may have work; markHeld
// that any held one may; markOpen that an unheld one may.
func (r *Runner) markDirty(convs ...string) {
	r.mu.Lock()
	for _, c := range convs {
		if r.held[c] != nil {
			r.dirty[c] = true
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
// new work, or a run stopped elsewhere (its handlers are checked); an
// unheld one's is work for the producer to open. What changed while it was
// not listening is found by polling at once.
//
// Behind a transaction-mode pooler with no ListenPool there is nothing to
// LISTEN on: the slow poll (PollInterval) finds the news instead.
func (r *Runner) listenLoop() {
	defer r.loops.Done()
	pool := r.core.Listener()
	if pool == nil {
		return
	}
	listen(r.runCtx, pool, r.core.Store.ChangeChannel(), r.logger, "runner",
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
				r.checkRuns(n.Payload)
			} else {
				r.markNews(n.Payload)
			}
		})
}

// renewLoop renews every held lease each third of the lease, in one
// statement; a lease it could not renew was taken over: that
// conversation's handlers are cancelled and it is forgotten.
func (r *Runner) renewLoop() {
	defer r.loops.Done()
	tick := time.NewTicker(r.cfg.ConversationLease / 3)
	defer tick.Stop()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		var ids []string
		var epochs []int64
		for id, h := range r.held {
			if !h.releasing {
				ids, epochs = append(ids, id), append(epochs, h.lease.Epoch)
			}
		}
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		sent := time.Now()
		renewed, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]string, error) {
			return r.core.RenewLeases(r.runCtx, db, r.cfg.NodeID, ids, epochs, r.cfg.ConversationLease)
		})
		if err != nil {
			if r.runCtx.Err() == nil {
				r.logger.WarnContext(r.runCtx, "arbor: renewing leases failed", slog.String("error", err.Error()))
			}
			continue
		}
		ok := make(map[string]bool, len(renewed))
		for _, id := range renewed {
			ok[id] = true
		}
		until := sent.Add(r.cfg.ConversationLease)
		r.mu.Lock()
		for i, id := range ids {
			if h := r.held[id]; ok[id] && h != nil && h.lease.Epoch == epochs[i] && until.After(h.confirmed) {
				h.confirmed = until
			}
		}
		r.mu.Unlock()
		for i, id := range ids {
			if !ok[id] {
				r.lost(id, epochs[i])
			}
		}
	}
}

// lost handles a lease taken over: its handlers are cancelled (their
// writes are refused anyway) and the conversation is forgotten. A lease the
// runner gave up itself meanwhile is not a take-over.
func (r *Runner) lost(id string, epoch int64) {
	r.mu.Lock()
	h := r.held[id]
	if h == nil || h.releasing || h.lease.Epoch != epoch {
		r.mu.Unlock()
		return
	}
	delete(r.held, id)
	for _, a := range r.runs {
		if a.conv == id {
			a.cancel(errConversationLost)
		}
	}
	r.mu.Unlock()
	r.logger.WarnContext(r.runCtx, "arbor: conversation lease lost", slog.String("conversation_id", id), slog.Int64("epoch", epoch))
}

// fenceMargin is how long before the end of its confirmed lease a runner
// stops a conversation's handlers when no renewal has confirmed it since:
// the time its handlers have to honour their cancelled context before
// another node may take the conversation over.
func (r *Runner) fenceMargin() time.Duration { return r.cfg.ConversationLease / 4 }

// fenceOverdue gives up, here, every held conversation whose lease no
// renewal confirmed in time (the renewer is stuck behind a slow database,
// or the process was starved): its handlers are cancelled and it is
// forgotten, before the lease can expire in the database. The lease itself
// expires (or a late renewal extends it), and its next holder recovers the
// tasks. A runner that cannot renew cannot know that it still holds a
// conversation, so it stops acting as if it did.
func (r *Runner) fenceOverdue(now time.Time) {
	margin := r.fenceMargin()
	r.mu.Lock()
	var overdue []string
	for id, h := range r.held {
		if !h.releasing && now.After(h.confirmed.Add(-margin)) {
			overdue = append(overdue, id)
			delete(r.held, id)
			delete(r.dirty, id)
			r.gaveUp[id] = gaveUp{epoch: h.lease.Epoch, at: now}
		}
	}
	for id, g := range r.gaveUp {
		if now.Sub(g.at) > 2*r.cfg.ConversationLease {
			delete(r.gaveUp, id) // expired long since: the database no longer names this node
		}
	}
	if len(overdue) > 0 {
		gone := make(map[string]bool, len(overdue))
		for _, id := range overdue {
			gone[id] = true
		}
		for _, a := range r.runs {
			if gone[a.conv] {
				a.cancel(errConversationLost)
			}
		}
	}
	r.mu.Unlock()
	if len(overdue) > 0 {
		r.logger.Warn("arbor: conversation leases not renewed in time; their handlers are stopped before the leases can expire",
			slog.Int("conversations", len(overdue)), slog.String("first", overdue[0]))
	}
}

// checkRuns cancels the handlers whose task is no longer theirs (aborted,
// cancelled, taken over), of one conversation or (conv "") all.
func (r *Runner) checkRuns(conv string) {
	r.mu.Lock()
	var ids []int64
	for id, a := range r.runs {
		if conv == "" || a.conv == conv {
			ids = append(ids, id)
		}
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	states, err := r.core.Store.RunStates(r.runCtx, r.core.Pool, ids)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range states {
		if a := r.runs[st.ID]; a != nil && (st.Status != arbortype.StatusRunning || st.Token != a.token) {
			a.cancel(ErrTaskStopped)
		}
	}
}

// watchLoop checks every running handler each PollInterval: one whose task
// was taken from it is cancelled, one past its task lease warned about, and
// one past twice its task lease cancelled. Its cost grows with the running
// handlers (at most Workers), not with the conversations held.
//
// It also stops the handlers of every conversation whose lease it could not
// confirm in time (fenceOverdue), so it ticks at least eight times a
// conversation lease.
func (r *Runner) watchLoop() {
	defer r.loops.Done()
	tick := time.NewTicker(min(r.cfg.PollInterval, r.cfg.ConversationLease/8))
	defer tick.Stop()
	lease := r.core.Cfg.TaskLease
	lastCheck := time.Now()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-tick.C:
		}
		r.fenceOverdue(time.Now())
		if time.Since(lastCheck) < r.cfg.PollInterval {
			continue
		}
		lastCheck = time.Now()
		r.checkRuns("")
		now := time.Now()
		r.mu.Lock()
		for id, a := range r.runs {
			deadline := a.run.leaseDeadline()
			switch {
			case now.After(deadline.Add(lease)):
				r.logger.Warn("arbor: handler blocked past twice its task lease; cancelling it",
					slog.Int64("task_id", id), slog.String("kind", a.kind))
				a.cancel(ErrBlocked)
			case now.After(deadline) && !a.warned:
				a.warned = true
				r.logger.Warn("arbor: handler ran past its task lease without a checkpoint or heartbeat",
					slog.Int64("task_id", id), slog.String("kind", a.kind))
			}
		}
		r.mu.Unlock()
	}
}

// maintenanceLoop fails, each PollInterval, the live tasks past their
// deadline (their foreground subtrees aborted), and, less often, the
// never-started tasks of kinds no runner claimed within UnknownKindGrace
// (the prune is a periodic River job: pruneworker.go). Every runner does
// it; the engine's transactions make a second runner's attempt a no-op.
func (r *Runner) maintenanceLoop() {
	defer r.loops.Done()
	interval := min(r.cfg.UnknownKindGrace/4, time.Minute)
	if interval <= 0 {
		interval = time.Minute
	}
	slow := time.NewTicker(interval)
	defer slow.Stop()
	fast := time.NewTicker(r.cfg.PollInterval)
	defer fast.Stop()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-fast.C:
			r.expireDeadlines()
			r.expireWallTime()
		case <-slow.C:
			r.failUnknownKinds()
			r.sweepLapsedReservations()
		}
	}
}

// expireDeadlines fails the live tasks past their deadline.
func (r *Runner) expireDeadlines() {
	ids, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]int64, error) { return r.core.LiveDeadlines(r.runCtx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (bool, error) { return r.core.Expire(r.runCtx, tx, id) })
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task past its deadline failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// expireWallTime fails the live tasks under a "fail" wall-time budget
// that is over (arbortype.CounterWallTime).
func (r *Runner) expireWallTime() {
	ids, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]int64, error) { return r.core.OverWallTime(r.runCtx, db, 100) })
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (bool, error) { return r.core.ExpireWallTime(r.runCtx, tx, id) })
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task over its wall-time budget failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// sweepLapsedReservations spends in full the reservations whose run is
// over (a crash between reserve and record), so that budgets read right
// without waiting for the next reservation of the counter, which would
// sweep them too.
func (r *Runner) sweepLapsedReservations() {
	pairs, err := core.Read(r.runCtx, r.core, func(db store.DB) ([]store.ConversationCounter, error) {
		return r.core.LapsedReservations(r.runCtx, db, 100)
	})
	if err != nil {
		return
	}
	for _, p := range pairs {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (struct{}, error) {
			return struct{}{}, r.core.SweepLapsed(r.runCtx, tx, p.ConversationID, p.Counter)
		})
		if err != nil && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: spending lapsed reservations failed", slog.String("conversation_id", p.ConversationID),
				slog.String("counter", p.Counter), slog.String("error", err.Error()))
		}
	}
}

func (r *Runner) failUnknownKinds() {
	ids, err := r.core.Store.StaleUnknownKinds(r.runCtx, r.core.Pool, r.kinds, r.cfg.UnknownKindGrace, 100)
	if err != nil {
		return
	}
	for _, id := range ids {
		_, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (arbortype.Task, error) {
			return r.core.ForceFail(r.runCtx, tx, id, arbortype.TaskError{Code: core.CodeUnknownKind,
				Message: fmt.Sprintf("no runner had a handler for its kind within %s", r.cfg.UnknownKindGrace)})
		})
		if err != nil && !errors.Is(err, tasks.ErrInvalidTransition) {
			r.logger.WarnContext(r.runCtx, "arbor: failing a task of unknown kind failed", slog.Int64("task_id", id), slog.String("error", err.Error()))
		}
	}
}

// releaseAll gives every held conversation up at shutdown: the idle ones
// in one statement, those with a handler still running (one that ignored
// its cancelled context) one by one, each recovering its runs in its
// release's transaction, so that nothing the handler writes later lands.
func (r *Runner) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.mu.Lock()
	var idle, busy []core.Lease
	for _, h := range r.held {
		h.releasing = true
		if h.running == 0 {
			idle = append(idle, h.lease)
		} else {
			busy = append(busy, h.lease)
		}
	}
	r.mu.Unlock()
	freed, err := core.Read(ctx, r.core, func(db store.DB) ([]string, error) {
		return r.core.ReleaseIdle(ctx, db, r.cfg.NodeID, idle)
	})
	if err != nil {
		r.logger.Warn("arbor: releasing conversations at shutdown failed; their leases will expire", slog.String("error", err.Error()))
	}
	done := map[string]bool{}
	for _, id := range freed {
		done[id] = true
	}
	for _, l := range idle {
		if !done[l.ConversationID] {
			busy = append(busy, l) // a run appeared since: the one-by-one path recovers it
		}
	}
	for _, l := range busy {
		rep, err := release(ctx, r.core, l)
		switch {
		case errors.Is(err, tasks.ErrLeaseLost):
		case err != nil:
			r.logger.Warn("arbor: releasing a conversation failed; its lease will expire", slog.String("conversation_id", l.ConversationID), slog.String("error", err.Error()))
		case !rep.Empty():
			r.logger.Info("arbor: released a conversation with tasks still running; they were recovered", slog.Any("report", rep))
		}
	}
	r.mu.Lock()
	r.held = map[string]*heldConv{}
	r.mu.Unlock()
}
