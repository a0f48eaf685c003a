package machine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// Defaults of RunnerConfig.
const (
	CapacityDefault          = 1000
	WorkersDefault           = 16
	ConversationLeaseDefault = 15 * time.Second
	PollIntervalDefault      = time.Second
	IdleReleaseDefault       = 5 * time.Second
	ShutdownGraceDefault     = 10 * time.Second
	UnknownKindGraceDefault  = 10 * time.Minute
)

// RunnerConfig configures a Runner. The zero value of every field means its
// default.
type RunnerConfig struct {
	// NodeID names this runner as the holder of the conversations it runs.
	// It must be unique among live runners. Default: hostname, pid and a
	// random suffix.
	NodeID string
	// Capacity is the most conversations this runner holds at once.
	// Default CapacityDefault (1000).
	Capacity int
	// Workers is the most handlers running at once on this node, over all
	// its conversations. Default WorkersDefault (16).
	Workers int
	// ConversationLease is how long this runner's hold on a conversation
	// lasts without renewal: a runner that stops renewing (it died, or is
	// paused) loses its conversations this long after its last renewal, and
	// only then can another runner take them over and recover their tasks.
	// Renewed every third of it, for all held conversations in one
	// statement. (Not the task lease, tasks.Config.TaskLease, which only
	// drives the watchdog.) Default ConversationLeaseDefault (15 s).
	ConversationLease time.Duration
	// PollInterval is the slow poll that covers missed notifications: the
	// claim loop's and each machine's re-read. Default PollIntervalDefault (1 s).
	PollInterval time.Duration
	// IdleRelease is how long a machine with nothing to run keeps its
	// conversation before releasing it. Default IdleReleaseDefault (5 s).
	IdleRelease time.Duration
	// ShutdownGrace is how long Stop lets running handlers finish before
	// cancelling their contexts. Default ShutdownGraceDefault (10 s).
	ShutdownGrace time.Duration
	// UnknownKindGrace is how long a task whose kind no runner has a handler
	// for stays pending (a rolling deploy) before it is failed with code
	// "unknown_kind". Every runner must know every kind once a deploy is
	// done. Default UnknownKindGraceDefault (10 min).
	UnknownKindGrace time.Duration
	// GenerationKinds are the root task kinds that are generations (turns):
	// at most one runs at a time per conversation, oldest first. Default
	// (nil): every root task is a generation.
	GenerationKinds []string
	// Waker configures the wake service the runner starts (the River client
	// that works wake jobs, and local timers for the sleeps of the
	// conversations it holds). Default: WakerConfig's defaults.
	Waker *WakerConfig
	// OnReconcile, if not nil, receives the report of every take-over.
	OnReconcile func(reconcile.Report)
	// Logger receives the runner's logs. Default: the engine's.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *RunnerConfig) WithDefaults() *RunnerConfig {
	out := RunnerConfig{}
	if c != nil {
		out = *c
	}
	if out.NodeID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		out.NodeID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if out.Capacity == 0 {
		out.Capacity = CapacityDefault
	}
	if out.Workers == 0 {
		out.Workers = WorkersDefault
	}
	if out.ConversationLease == 0 {
		out.ConversationLease = ConversationLeaseDefault
	}
	if out.PollInterval == 0 {
		out.PollInterval = PollIntervalDefault
	}
	if out.IdleRelease == 0 {
		out.IdleRelease = IdleReleaseDefault
	}
	if out.ShutdownGrace == 0 {
		out.ShutdownGrace = ShutdownGraceDefault
	}
	if out.UnknownKindGrace == 0 {
		out.UnknownKindGrace = UnknownKindGraceDefault
	}
	return &out
}

func (c *RunnerConfig) validate() error {
	switch {
	case len(c.NodeID) > 200:
		return errors.New("RunnerConfig.NodeID: over 200 bytes")
	case c.Capacity < 1:
		return fmt.Errorf("RunnerConfig.Capacity: %d is below 1", c.Capacity)
	case c.Workers < 1:
		return fmt.Errorf("RunnerConfig.Workers: %d is below 1", c.Workers)
	case c.ConversationLease < 100*time.Millisecond || c.ConversationLease > 24*time.Hour:
		return fmt.Errorf("RunnerConfig.ConversationLease: %s is outside 100ms..24h", c.ConversationLease)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("RunnerConfig.PollInterval: %s is below 1ms", c.PollInterval)
	case c.IdleRelease < 0 || c.ShutdownGrace < 0 || c.UnknownKindGrace < 0:
		return errors.New("RunnerConfig: IdleRelease, ShutdownGrace and UnknownKindGrace must not be negative")
	}
	return nil
}

// Runner is the node's claim loop and worker pool (see the package doc).
type Runner struct {
	core     *core.Engine
	cfg      *RunnerConfig
	logger   *slog.Logger
	handlers map[string]Handler
	kinds    []string
	isGen    func(string) bool
	waker    *Waker
	slots    chan struct{}

	// starved are the machines that found no free worker slot, first come
	// first served: each slot given back pokes one of them.
	starvedMu sync.Mutex
	starved   []*machine

	mu        sync.Mutex
	machines  map[string]*machine
	started   bool
	stopping  bool
	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	loops     sync.WaitGroup
	claimKick chan struct{}
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
		core:      c,
		cfg:       cfg,
		logger:    cfg.Logger.With(slog.String("node", cfg.NodeID)),
		handlers:  handlers,
		slots:     make(chan struct{}, cfg.Workers),
		machines:  map[string]*machine{},
		claimKick: make(chan struct{}, 1),
	}
	for kind, h := range handlers {
		if kind == "" || h == nil {
			return nil, fmt.Errorf("machine.NewRunner: handler for kind %q is empty: %w", kind, tasks.ErrInvalidArgument)
		}
		r.kinds = append(r.kinds, kind)
	}
	slices.Sort(r.kinds)
	if cfg.GenerationKinds != nil {
		gen := map[string]bool{}
		for _, k := range cfg.GenerationKinds {
			gen[k] = true
		}
		r.isGen = func(kind string) bool { return gen[kind] }
	}
	wcfg := cfg.Waker.WithDefaults()
	if wcfg.Logger == nil {
		wcfg.Logger = cfg.Logger
	}
	waker, err := NewWaker(engine, wcfg)
	if err != nil {
		return nil, fmt.Errorf("machine.NewRunner: %w", err)
	}
	r.waker = waker
	return r, nil
}

// NodeID returns the name this runner holds conversations under.
func (r *Runner) NodeID() string { return r.cfg.NodeID }

// Start starts the wake service, the claim loop, the lease renewal and the
// notification listener. ctx bounds the start only; Stop ends the runner.
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
	r.runCtx, r.cancelRun = context.WithCancelCause(context.WithoutCancel(ctx))
	r.loops.Add(4)
	go r.claimLoop()
	go r.renewLoop()
	go r.listenLoop()
	go r.maintenanceLoop()
	r.kickClaim()
	return nil
}

// Stop stops claiming, lets running handlers finish for ShutdownGrace, then
// cancels the rest, releases every conversation and stops the wake service.
// ctx bounds the whole stop; when it ends first, handlers are cancelled at
// once.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started || r.stopping {
		r.mu.Unlock()
		return nil
	}
	r.stopping = true
	ms := r.held()
	r.mu.Unlock()

	for _, m := range ms {
		m.poke()
	}
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	defer grace.Stop()
	drained := make(chan struct{})
	go func() {
		for _, m := range ms {
			<-m.done
		}
		close(drained)
	}()
	cancelAll := func() {
		for _, m := range ms {
			m.cancel(ErrShutdown)
		}
	}
	var stuck error
	select {
	case <-drained:
	case <-grace.C:
		r.logger.WarnContext(ctx, "arbor: shutdown grace over; cancelling running handlers")
		cancelAll()
	case <-ctx.Done():
		cancelAll()
	}
	// Cancelled handlers get a moment to return, whatever ctx says.
	late := time.NewTimer(time.Second)
	defer late.Stop()
	select {
	case <-drained:
	case <-late.C:
	}
	select {
	case <-drained:
	default:
		// Handlers that ignore their context: release their conversations
		// anyway. The release recovers their tasks (back to pending, their
		// tokens dead) in its transaction, so nothing these handlers write
		// from now on lands: a stopped runner writes nothing.
		var n int
		for _, m := range ms {
			select {
			case <-m.done:
			default:
				n++
				m.release()
			}
		}
		stuck = fmt.Errorf("machine: Runner.Stop: handlers of %d conversations ignored their cancelled context; their conversations were released and their tasks recovered", n)
	}
	r.cancelRun(ErrShutdown)
	r.loops.Wait()
	if err := r.waker.Stop(ctx); err != nil {
		return err
	}
	return stuck
}

// Held returns the conversations this runner holds now.
func (r *Runner) Held() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.machines))
	for id := range r.machines {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (r *Runner) held() []*machine {
	out := make([]*machine, 0, len(r.machines))
	for _, m := range r.machines {
		out = append(out, m)
	}
	return out
}

func (r *Runner) kickClaim() {
	select {
	case r.claimKick <- struct{}{}:
	default:
	}
}

// claimLoop takes conversations with runnable work and no live holder.
func (r *Runner) claimLoop() {
	defer r.loops.Done()
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-tick.C:
		case <-r.claimKick:
		}
		if err := r.claimConversations(r.runCtx); err != nil && r.runCtx.Err() == nil {
			r.logger.WarnContext(r.runCtx, "arbor: claiming conversations failed", slog.String("error", err.Error()))
		}
	}
}

func (r *Runner) claimConversations(ctx context.Context) error {
	r.mu.Lock()
	free := r.cfg.Capacity - len(r.machines)
	stopping := r.stopping
	r.mu.Unlock()
	if stopping || free <= 0 {
		return nil
	}
	ids, err := r.core.Store.ClaimableConversations(ctx, r.core.Pool, r.kinds, free)
	if err != nil {
		return err
	}
	for _, id := range ids {
		r.mu.Lock()
		_, held := r.machines[id]
		r.mu.Unlock()
		if held {
			continue
		}
		if err := r.open(ctx, id); err != nil && !errors.Is(err, tasks.ErrLeaseHeld) {
			return err
		}
	}
	return nil
}

// open takes a conversation's lease and runs reconcile_on_open in the same
// transaction, then starts its machine.
func (r *Runner) open(ctx context.Context, id string) error {
	var (
		lease core.Lease
		rep   reconcile.Report
	)
	_, err := core.Tx(ctx, r.core, func(tx pgx.Tx) (struct{}, error) {
		var err error
		if lease, err = r.core.TakeLease(ctx, tx, id, r.cfg.NodeID, r.cfg.ConversationLease); err != nil {
			return struct{}{}, err
		}
		rep, err = reconcile.OnOpen(ctx, r.core, tx, id)
		return struct{}{}, err
	})
	if err != nil {
		return fmt.Errorf("open conversation %q: %w", id, err)
	}
	if !rep.Empty() {
		r.logger.InfoContext(ctx, "arbor: conversation recovered", slog.Any("report", rep), slog.Int64("epoch", lease.Epoch))
	}
	if r.cfg.OnReconcile != nil {
		r.cfg.OnReconcile(rep)
	}
	m := newMachine(r, lease)
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		m.release()
		return nil
	}
	r.machines[id] = m
	r.mu.Unlock()
	go m.loop()
	return nil
}

// releaseSlots gives n worker slots back and pokes as many of the machines
// that went without one, oldest first. (Poking them all would have every
// starved machine of a busy node re-read the database for each slot.) A
// poked machine that finds nothing to run gives its slots back, which pokes
// the next.
func (r *Runner) releaseSlots(n int) {
	if n <= 0 {
		return
	}
	for range n {
		<-r.slots
	}
	r.starvedMu.Lock()
	k := min(n, len(r.starved))
	next := slices.Clone(r.starved[:k])
	r.starved = slices.Delete(r.starved, 0, k)
	r.starvedMu.Unlock()
	for _, m := range next {
		m.poke()
	}
}

// starve queues m, which found no free slot, to be poked when one is given
// back. If one was given back meanwhile, the head of the queue is poked at
// once, so no wake-up is lost between the two.
func (r *Runner) starve(m *machine) {
	r.starvedMu.Lock()
	if !slices.Contains(r.starved, m) {
		r.starved = append(r.starved, m)
	}
	var head *machine
	if len(r.slots) < cap(r.slots) && len(r.starved) > 0 {
		head = r.starved[0]
		r.starved = r.starved[1:]
	}
	r.starvedMu.Unlock()
	if head != nil {
		head.poke()
	}
}

// forget drops a machine that ended.
func (r *Runner) forget(m *machine) {
	r.mu.Lock()
	if r.machines[m.lease.ConversationID] == m {
		delete(r.machines, m.lease.ConversationID)
	}
	r.mu.Unlock()
	r.kickClaim()
}

// renewLoop renews every held lease each third of the lease, in one statement.
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
		var ms []*machine
		for _, m := range r.machines {
			if !m.releasing.Load() {
				ms = append(ms, m)
			}
		}
		r.mu.Unlock()
		if len(ms) == 0 {
			continue
		}
		ids := make([]string, len(ms))
		epochs := make([]int64, len(ms))
		for i, m := range ms {
			ids[i], epochs[i] = m.lease.ConversationID, m.lease.Epoch
		}
		renewed, err := r.core.RenewLeases(r.runCtx, r.core.Pool, r.cfg.NodeID, ids, epochs, r.cfg.ConversationLease)
		if err != nil {
			if r.runCtx.Err() == nil {
				r.logger.WarnContext(r.runCtx, "arbor: renewing leases failed", slog.String("error", err.Error()))
			}
			continue
		}
		for _, m := range ms {
			// A machine that began its own release meanwhile is not a
			// take-over: its release freed the lease.
			if !slices.Contains(renewed, m.lease.ConversationID) && !m.releasing.Load() {
				r.logger.WarnContext(r.runCtx, "arbor: conversation lease lost", slog.String("conversation_id", m.lease.ConversationID), slog.Int64("epoch", m.lease.Epoch))
				m.cancel(errConversationLost)
			}
		}
	}
}

// listenLoop hears the change channel and pokes the machine holding each
// announced conversation, or the claim loop when none here does. What
// changed while it was not listening is found by polling at once.
func (r *Runner) listenLoop() {
	defer r.loops.Done()
	listen(r.runCtx, r.core.Pool, r.core.Store.ChangeChannel(), r.logger, "runner",
		func() {
			r.kickClaim()
			r.pokeAll()
		},
		func(n *pgconn.Notification) {
			r.mu.Lock()
			m := r.machines[n.Payload]
			r.mu.Unlock()
			if m != nil {
				m.poke()
			} else {
				r.kickClaim()
			}
		})
}

func (r *Runner) pokeAll() {
	r.mu.Lock()
	ms := r.held()
	r.mu.Unlock()
	for _, m := range ms {
		m.poke()
	}
}

// maintenanceLoop fails never-started tasks of kinds no runner claimed
// within UnknownKindGrace.
func (r *Runner) maintenanceLoop() {
	defer r.loops.Done()
	interval := min(r.cfg.UnknownKindGrace/4, time.Minute)
	if interval <= 0 {
		interval = time.Minute
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-tick.C:
		}
		ids, err := r.core.Store.StaleUnknownKinds(r.runCtx, r.core.Pool, r.kinds, r.cfg.UnknownKindGrace, 100)
		if err != nil {
			continue
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
}
