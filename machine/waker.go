package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// Defaults of WakerConfig.
const (
	// WakeHorizonDefault: timers are armed for sleeps due within this.
	WakeHorizonDefault = 30 * time.Second
	// WakePollIntervalDefault: how often sleeping tasks are re-read.
	WakePollIntervalDefault = 5 * time.Second
	// WakePollLimitDefault: the most sleeps one poll arms.
	WakePollLimitDefault = 10_000
	// WakeWorkersDefault: River workers of the wake queue.
	WakeWorkersDefault = 10
	// WakeFetchPollIntervalDefault: River's fetch poll of the wake queue
	// (River's own default).
	WakeFetchPollIntervalDefault = river.FetchPollIntervalDefault
	// WakeRescueAfterDefault: how long a wake or prune job may stay running
	// before River's rescuer retries it (River's own default is an hour).
	WakeRescueAfterDefault = time.Minute
)

// WakeSource says which path woke a task.
type WakeSource string

const (
	WokenByTimer WakeSource = "timer"
	WokenByRiver WakeSource = "river"
)

// Wake reports a wake that a Waker committed (WakerConfig.OnWake,
// Observation.Wake).
type Wake struct {
	TaskID         int64
	SleepSeq       int64
	ConversationID string
	By             WakeSource
	// Late is how long after its wake time the wake committed, by this
	// process's clock (a timer's corrected to the database's; River's by
	// the job's scheduled time). 0 when it was not late.
	Late time.Duration
}

// WakerConfig configures a Waker. The zero value of every field means its
// default.
type WakerConfig struct {
	// DisableTimers turns the local timers off: sleeps are then woken by
	// River alone, which promotes scheduled jobs only every ~5 s. For tests,
	// benchmarks, and processes that should work the wake queue without
	// keeping timers. Default false (timers on).
	DisableTimers bool
	// Horizon is how far ahead timers are armed: a sleep due later is armed
	// by a later poll. Must exceed PollInterval. Default WakeHorizonDefault
	// (30 s).
	Horizon time.Duration
	// PollInterval is how often the waker re-reads the sleeping tasks due
	// within Horizon, catching sleeps whose notification it missed (it was
	// not running, or its LISTEN connection dropped). Default
	// WakePollIntervalDefault (5 s).
	PollInterval time.Duration
	// PollLimit bounds the sleeps one poll arms (soonest first); the rest
	// are left to River and later polls. Default WakePollLimitDefault.
	PollLimit int
	// Workers is the River wake queue's MaxWorkers. Default
	// WakeWorkersDefault (10).
	Workers int
	// FetchPollInterval is River's fetch poll interval for the wake queue.
	// Default WakeFetchPollIntervalDefault (River's default, 1 s).
	FetchPollInterval time.Duration
	// RescueStuckJobsAfter is how long one of the waker's River jobs (a
	// wake, a prune) may stay running before River's rescuer makes it
	// available again. A job whose client lost its database mid-job (a
	// failover that demoted the primary, a partition) can be left running
	// in the database with nobody working it; until it is rescued, the
	// sleep it wakes waits for a waker's timer, or, with the timers off,
	// for nothing. It is also the
	// jobs' timeout (River's JobTimeout), at most a minute. At least 1 s.
	// Default WakeRescueAfterDefault (1 min).
	RescueStuckJobsAfter time.Duration
	// Filter, if not nil, limits timers to the sleeps of conversations for
	// which it returns true (a runner passes the conversations it holds).
	// River's worker wakes every conversation's sleeps regardless. Default:
	// every conversation.
	Filter func(conversationID string) bool
	// OnWake, if not nil, is called after each wake this waker committed,
	// by a timer or by its River worker, from the goroutine that woke it.
	// A wake whose commit's answer was lost (the connection failed during
	// its COMMIT) is not reported: the waker does not know it committed,
	// and the job worked again finds the task awake.
	OnWake func(Wake)
	// RiverTestOnly sets River's Config.TestOnly (no staggered start of its
	// maintenance services). For tests only. Default false.
	RiverTestOnly bool
	// Logger receives the waker's logs and River's. Default: the engine's.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *WakerConfig) WithDefaults() *WakerConfig {
	out := WakerConfig{}
	if c != nil {
		out = *c
	}
	if out.Horizon == 0 {
		out.Horizon = WakeHorizonDefault
	}
	if out.PollInterval == 0 {
		out.PollInterval = WakePollIntervalDefault
	}
	if out.PollLimit == 0 {
		out.PollLimit = WakePollLimitDefault
	}
	if out.Workers == 0 {
		out.Workers = WakeWorkersDefault
	}
	if out.FetchPollInterval == 0 {
		out.FetchPollInterval = WakeFetchPollIntervalDefault
	}
	if out.RescueStuckJobsAfter == 0 {
		out.RescueStuckJobsAfter = WakeRescueAfterDefault
	}
	return &out
}

func (c *WakerConfig) validate() error {
	switch {
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("WakerConfig.PollInterval: %s is below 1ms", c.PollInterval)
	case c.Horizon <= c.PollInterval:
		return fmt.Errorf("WakerConfig.Horizon: %s must exceed PollInterval %s", c.Horizon, c.PollInterval)
	case c.PollLimit < 1:
		return fmt.Errorf("WakerConfig.PollLimit: %d is below 1", c.PollLimit)
	case c.Workers < 1:
		return fmt.Errorf("WakerConfig.Workers: %d is below 1", c.Workers)
	case c.RescueStuckJobsAfter < time.Second:
		return fmt.Errorf("WakerConfig.RescueStuckJobsAfter: %s is below 1s", c.RescueStuckJobsAfter)
	case c.FetchPollInterval < river.FetchPollIntervalMin:
		return fmt.Errorf("WakerConfig.FetchPollInterval: %s is below River's minimum %s", c.FetchPollInterval, river.FetchPollIntervalMin)
	}
	return nil
}

// Waker ends sleeps on time. It starts the River client that works
// the wake queue with its worker (the durable path: an insert-only
// client never promotes scheduled jobs), and, unless timers are disabled,
// keeps an in-process timer for every sleep due within its horizon. It
// learns of sleeps from the notification each sleep's transaction sends
// (LISTEN) and from a periodic poll of sleeping tasks; a timer that fires
// wakes its sleep through the engine's one wake path (WakeSleeping of
// internal/core/sleep.go), the same idempotent path as River's worker, so
// a sleep woken by both, or by two wakers, wakes once.
//
// Start it once and Stop it once. It LISTENs while it runs on the process's
// one listener of the engine's pool (shared with a Runner and the engine's
// followers), from the engine's tasks.Config.ListenPool if there is one. Behind
// a transaction-mode pooler (tasks.Config.TransactionPooler) River's client
// runs poll-only, and with no ListenPool the timers learn of sleeps from the
// poll alone (PollInterval).
type Waker struct {
	core   *core.Engine
	cfg    *WakerConfig
	logger *slog.Logger
	river  *river.Client[pgx.Tx]

	// offset is the database's clock minus ours (ns), measured at each
	// poll, so that timers fire by the database's clock.
	offset atomic.Int64
	kick   chan struct{}

	// wake, when set (a Runner's waker), makes a timer's wake: the wake and
	// the claim of what it made runnable in one transaction, dispatched at
	// once (see Runner.wakeAndClaim); nil: the wake alone.
	wake func(ctx context.Context, taskID, sleepSeq int64, conv string) (bool, error)

	mu      sync.Mutex
	timers  map[sleepKey]*timerEntry
	running bool
	stopped bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewWaker returns a Waker for engine's schema. It does not start anything.
func NewWaker(engine *tasks.Engine, cfg *WakerConfig) (*Waker, error) {
	c := core.Of(engine)
	if c == nil {
		return nil, fmt.Errorf("machine.NewWaker: engine is nil: %w", arbortype.ErrInvalidArgument)
	}
	return newWaker(c, cfg)
}

// newWaker is NewWaker on c (a Runner's: the engine on the runner's pool).
// riverSoftStop is how long a stopping waker lets River's jobs in flight
// finish before their contexts are cancelled: a wake is one short
// transaction; a prune batch may be longer, and is cut (rolled back).
const riverSoftStop = 5 * time.Second

func newWaker(c *core.Engine, cfg *WakerConfig) (*Waker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("machine.NewWaker: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = c.Logger
	}
	w := &Waker{
		core:   c,
		cfg:    cfg,
		logger: cfg.Logger,
		kick:   make(chan struct{}, 1),
		timers: map[sleepKey]*timerEntry{},
	}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, newWakeWorker(c, cfg.OnWake, cfg.Logger)); err != nil {
		return nil, fmt.Errorf("machine.NewWaker: %w", err)
	}
	if err := river.AddWorkerSafely(workers, &pruneWorker{core: c, logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("machine.NewWaker: %w", err)
	}
	// The prune (the log past LogRetention, settled history past
	// Retention) runs as a periodic job: River's leader inserts it, so one
	// node of the cluster prunes each period.
	prune := river.NewPeriodicJob(river.PeriodicInterval(c.Cfg.PruneInterval),
		func() (river.JobArgs, *river.InsertOpts) { return core.PruneArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true})
	client, err := river.NewClient(riverpgxv5.New(c.Pool), &river.Config{
		Schema: c.Cfg.Schema,
		Queues: map[string]river.QueueConfig{
			core.WakeQueue:  {MaxWorkers: cfg.Workers},
			core.PruneQueue: {MaxWorkers: 1},
		},
		PeriodicJobs:      []*river.PeriodicJob{prune},
		Workers:           workers,
		FetchPollInterval: cfg.FetchPollInterval,
		FetchCooldown:     min(river.FetchCooldownDefault, cfg.FetchPollInterval),
		Logger:            cfg.Logger,
		// A job left running by a client that lost its database (River's
		// completer gives up after a few tries) is rescued after this, not
		// River's hour; River requires the jobs' timeout not to exceed it.
		RescueStuckJobsAfter: cfg.RescueStuckJobsAfter,
		JobTimeout:           min(river.JobTimeoutDefault, cfg.RescueStuckJobsAfter),
		// River LISTENs on the pool it is given; through a pooler in
		// transaction mode that would hear nothing, so it polls.
		PollOnly: c.Cfg.TransactionPooler,
		TestOnly: cfg.RiverTestOnly,
		// Stop cancels the context River was started with; without a soft
		// stop, River takes that for StopAndCancel and cancels the jobs it
		// is working: a wake whose COMMIT was on its way could commit with
		// its worker told it failed (not reported to OnWake, and River's
		// Stop returned without it). With it, the jobs in flight finish;
		// past riverSoftStop (a prune batch, say) they are cancelled.
		SoftStopTimeout: riverSoftStop,
	})
	if err != nil {
		return nil, fmt.Errorf("machine.NewWaker: river client: %w", err)
	}
	w.river = client
	return w, nil
}

// Start starts River's client and, unless timers are disabled, the LISTEN
// and poll loops. ctx bounds the start only; Stop ends the waker.
func (w *Waker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running || w.stopped {
		return errors.New("machine: Waker.Start: a waker starts once (it was already started or stopped)")
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := w.river.Start(runCtx); err != nil {
		cancel()
		return fmt.Errorf("machine: Waker.Start: river: %w", err)
	}
	w.running, w.cancel = true, cancel
	if !w.cfg.DisableTimers {
		w.wg.Add(2)
		go w.listenLoop(runCtx)
		go w.pollLoop(runCtx)
	}
	return nil
}

// Stop stops the timers and the loops, waits for wakes in flight, and stops
// River's client (which finishes the jobs it is working, for up to
// riverSoftStop, and resigns its leadership, so another node's client takes
// over promptly). Sleeps that
// were armed here are left to River and to other wakers. ctx bounds the wait
// for River.
func (w *Waker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.running {
		w.mu.Unlock()
		return nil
	}
	w.running, w.stopped = false, true
	w.cancel()
	for k, e := range w.timers {
		e.timer.Stop()
		delete(w.timers, k)
	}
	w.mu.Unlock()
	w.wg.Wait()
	if err := w.river.Stop(ctx); err != nil {
		return fmt.Errorf("machine: Waker.Stop: river: %w", err)
	}
	return nil
}
