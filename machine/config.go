package machine

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/reconcile"
)

// Defaults of RunnerConfig. They are the fast path: a runner with
// RunnerConfig{} needs no tuning.
const (
	// CapacityDefault: conversations one node holds at once.
	CapacityDefault = 10_000
	// WorkersDefault: handlers running at once on a node.
	WorkersDefault = 1000
	// ConversationLeaseDefault: how long a dead node's conversations wait
	// before another node takes them over.
	ConversationLeaseDefault = 15 * time.Second
	// PollIntervalDefault: the slow poll behind notifications.
	PollIntervalDefault = time.Second
	// IdleReleaseDefault: how long a conversation with nothing to run stays
	// held (it costs nothing while it does).
	IdleReleaseDefault = time.Minute
	// ShutdownGraceDefault: how long Stop lets handlers finish.
	ShutdownGraceDefault = 10 * time.Second
	// UnknownKindGraceDefault: how long a task of a kind no runner knows
	// stays pending.
	UnknownKindGraceDefault = 10 * time.Minute
	// FlushersDefault: completer flushes in flight at once.
	FlushersDefault = 2
	// MaxBatchDefault: outcomes one flush applies at most.
	MaxBatchDefault = 1000
	// WorkPoolExtraConns: the connections of a runner's own pool besides
	// its Flushers' and the completer's express lane's (the producer, maintenance, the LISTEN connections of
	// the runner and its wake service, River's client, timers' wakes and the
	// handlers' own calls).
	WorkPoolExtraConns = 10
)

// RunnerConfig configures a Runner. The zero value of every field means its
// default.
type RunnerConfig struct {
	// NodeID names this runner as the holder of the conversations it runs.
	// It must be unique among live runners: it is what fences their claims.
	// Default: hostname, pid and a random suffix.
	NodeID string
	// Capacity is the most conversations this runner holds at once. A held
	// conversation with nothing to run costs a few words of memory and no
	// work; when the node is full and another conversation has work, the
	// longest idle one is released. Default CapacityDefault (10,000).
	Capacity int
	// Workers is the most handlers running at once on this node, over all
	// its conversations. Each running handler is a goroutine (a few KiB;
	// an agent's handlers mostly wait on a model or a tool); a handler's
	// slot is given back as soon as it has queued its ending write. It also
	// bounds the batches: one open or claim starts at most the free slots'
	// worth of runs, so fewer workers mean smaller batches and more
	// transactions per task. Default WorkersDefault (1,000).
	Workers int
	// ConversationLease is how long this runner's hold on its conversations
	// lasts without renewal: a runner that stops renewing (it died, is
	// paused, or is cut off from the database) loses its conversations this
	// long after its last renewal, and only then can another runner take
	// them over and recover their tasks. The runner renews its lease (one
	// row, whatever it holds) every sixth of it, and stops its handlers
	// at three quarters of it after the last renewal that succeeded
	// (docs/guarantees.md: a handler has the last quarter to return).
	//
	// It is not the task lease (tasks.Config.TaskLease, a deadline per
	// running task): that one fences nothing and lets nothing be taken
	// over; it only drives the watchdog's warning about a handler that
	// went quiet. Default ConversationLeaseDefault (15 s).
	ConversationLease time.Duration
	// LifeDir is a directory on this host's own disk where the runner keeps
	// a locked file for as long as its process lives. A runner of the same
	// host and schema that finds such a file unlocked knows its process
	// died (the kernel dropped the lock), and takes its conversations at
	// once instead of after ConversationLease: a process killed and started
	// again runs its conversations again within about a second. A frozen
	// process keeps its lock; another host waits for the lease. Linux only,
	// and only on a local filesystem (not NFS or another share: a runner
	// that finds one there warns and waits for leases). "-" turns it off.
	// Default: arbor-lives in os.TempDir().
	LifeDir string
	// PollInterval is the slow poll that covers missed notifications: one
	// claim across every held conversation and one look for conversations
	// with work and no holder, and the watchdog's check of running
	// handlers; and, on the runner that leads the schema's maintenance (one
	// runner per schema, see docs/architecture.md), the look for tasks past
	// their deadline or wall-time budget. Default PollIntervalDefault (1 s).
	PollInterval time.Duration
	// IdleRelease is how long a conversation with nothing to run stays held
	// before it is released. Holding it costs nothing; releasing it lets
	// another node take it. Default IdleReleaseDefault (1 min).
	IdleRelease time.Duration
	// ShutdownGrace is how long Stop lets running handlers finish before
	// cancelling their contexts. Default ShutdownGraceDefault (10 s).
	ShutdownGrace time.Duration
	// UnknownKindGrace is how long a task whose kind no runner has a handler
	// for stays pending (a rolling deploy) before it is failed with code
	// "unknown_kind". Every runner must know every kind once a deploy is
	// done. The runner that leads the schema's maintenance fails them, by
	// its own grace and the kinds it has handlers for. Default
	// UnknownKindGraceDefault (10 min).
	UnknownKindGrace time.Duration
	// GenerationKinds are the root task kinds that are generations (turns):
	// at most one runs at a time per conversation, oldest first. Default
	// (nil): every root task is a generation.
	GenerationKinds []string
	// Flushers is how many completer flushes may be in flight at once (each
	// on a connection of its own); outcomes queued meanwhile go in the next
	// one, so batches grow with the load. Default FlushersDefault (2).
	// Besides these, one express flush takes the ending calls (complete,
	// wait, sleep, a failure) queued while every one of them is in flight,
	// a few at a time, so that an ending does not wait behind a batch.
	Flushers int
	// MaxBatch bounds the outcomes one flush applies. Default
	// MaxBatchDefault (1,000).
	MaxBatch int
	// Pool is the runner's own pool: its producer, completer, maintenance,
	// wake service and its handlers' calls (Checkpoint, Spawn, Children…)
	// use it, never the engine's, so that a runner and the application do
	// not starve each other (pgxpool's default on a 2-core machine is 4
	// connections). The renewer, the watchdog and the announcements sent
	// after the runner's commits use a connection each of their own
	// besides, made from this one's configuration.
	// The caller owns a pool given here (Stop does not close it). Default:
	// a pool the runner makes from the engine pool's configuration, with
	// Flushers + 1 + WorkPoolExtraConns connections (13 by default), opened by
	// Start (lazily) and closed by Stop.
	Pool *pgxpool.Pool
	// BlockedAfter, when not zero, is how long a handler may run outside
	// arbor's calls without a checkpoint or heartbeat before the watchdog
	// cancels it (cause ErrBlocked; the task then fails as its handler
	// returns). Time spent inside an arbor call (waiting for a flush, a
	// reservation) is not counted. Default 0: never cancelled for it — a
	// handler waiting minutes on a model is not lost while its node holds
	// the conversation; the watchdog only warns once it passed its task
	// lease (tasks.Config.TaskLease).
	BlockedAfter time.Duration
	// Waker configures the wake service the runner starts (the River client
	// that works wake jobs, and local timers for the sleeps of the
	// conversations it holds). Default: WakerConfig's defaults.
	Waker *WakerConfig
	// OnReconcile, if not nil, receives the report of every conversation the
	// runner takes (empty when there was nothing to recover), one call at a
	// time: from the runner's loop, or from a Create of this process that
	// took a new conversation for it (docs/design.md §3.18). It must not
	// block.
	OnReconcile func(reconcile.Report)
	// Middleware wraps every run this runner starts, the first outermost
	// (see Middleware; otelarbor.Middleware makes a span of each run).
	// Default: none.
	Middleware []Middleware
	// Observer, if not nil, receives what the runner does: every run's end,
	// take-overs, wakes (see Observer; otelarbor.Middleware records metrics
	// from them). Default: none.
	Observer Observer
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
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&out.Capacity, CapacityDefault)
	def(&out.Workers, WorkersDefault)
	def(&out.Flushers, FlushersDefault)
	def(&out.MaxBatch, MaxBatchDefault)
	defD(&out.ConversationLease, ConversationLeaseDefault)
	if out.LifeDir == "" {
		out.LifeDir = lifeDirDefault()
	}
	defD(&out.PollInterval, PollIntervalDefault)
	defD(&out.IdleRelease, IdleReleaseDefault)
	defD(&out.ShutdownGrace, ShutdownGraceDefault)
	defD(&out.UnknownKindGrace, UnknownKindGraceDefault)
	return &out
}

func (c *RunnerConfig) validate() error {
	switch {
	case len(c.NodeID) > 200:
		return errors.New("RunnerConfig.NodeID: over 200 bytes")
	case !utf8.ValidString(c.NodeID) || strings.ContainsRune(c.NodeID, 0):
		return fmt.Errorf("RunnerConfig.NodeID %q: not valid UTF-8 text", c.NodeID)
	case c.Capacity < 1 || c.Capacity > 1_000_000:
		return fmt.Errorf("RunnerConfig.Capacity: %d is outside 1..1000000", c.Capacity)
	case c.Workers < 1 || c.Workers > 100_000:
		return fmt.Errorf("RunnerConfig.Workers: %d is outside 1..100000", c.Workers)
	case c.Flushers < 1 || c.Flushers > 64:
		return fmt.Errorf("RunnerConfig.Flushers: %d is outside 1..64", c.Flushers)
	case c.MaxBatch < 1 || c.MaxBatch > 10_000:
		return fmt.Errorf("RunnerConfig.MaxBatch: %d is outside 1..10000", c.MaxBatch)
	case strings.ContainsRune(c.LifeDir, 0):
		return errors.New("RunnerConfig.LifeDir: contains a NUL byte")
	case c.ConversationLease < 100*time.Millisecond || c.ConversationLease > 24*time.Hour:
		return fmt.Errorf("RunnerConfig.ConversationLease: %s is outside 100ms..24h", c.ConversationLease)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("RunnerConfig.PollInterval: %s is below 1ms", c.PollInterval)
	case c.IdleRelease < 0 || c.ShutdownGrace < 0 || c.UnknownKindGrace < 0 || c.BlockedAfter < 0:
		return errors.New("RunnerConfig: IdleRelease, ShutdownGrace, UnknownKindGrace and BlockedAfter must not be negative")
	}
	for i, m := range c.Middleware {
		if m == nil {
			return fmt.Errorf("RunnerConfig.Middleware[%d]: nil", i)
		}
	}
	return nil
}
