package tasks

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/migrations"
)

// Defaults of Config.
const (
	TaskLeaseDefault            = 30 * time.Second
	MaxPayloadBytesDefault      = 1 << 20 // 1 MiB
	MaxErrorMessageBytesDefault = 8 << 10 // 8 KiB
	RestartLimitDefault         = 5
	TxRetriesDefault            = 5
	RetryBackoffBaseDefault     = time.Second
	RetryBackoffCapDefault      = 5 * time.Minute
	ErrorHistoryLimitDefault    = 10
	UnavailableTimeoutDefault   = 30 * time.Second
	IdleInTransactionDefault    = 5 * time.Second
	LogRetentionDefault         = 7 * 24 * time.Hour
	PruneBatchDefault           = 500
	PruneIntervalDefault        = time.Hour
)

// TxRetriesNone is the Config.TxRetries that retries nothing (0 there
// means TxRetriesDefault, as for every field).
const TxRetriesNone = -1

// Config configures an Engine. The zero value of every field means its default.
type Config struct {
	// Schema is the schema arbor's tables live in. Default "arbor".
	Schema string
	// TaskLease is the task lease: a running task's deadline
	// (lease_expires_at), which a start, a checkpoint or a heartbeat sets
	// this far ahead by the database's clock. It only tells a handler that
	// went quiet from one that calls arbor: a runner's watchdog warns when
	// a handler runs this long outside arbor's calls without a checkpoint
	// or heartbeat (it cancels one only past
	// machine.RunnerConfig.BlockedAfter). Nothing is fenced, recovered or
	// taken over when it passes.
	//
	// It is not the conversation lease
	// (machine.RunnerConfig.ConversationLease, one per node, not per task):
	// that one is the node's hold on its conversations, and its expiry is
	// what stops a node's handlers and lets another node take them over.
	// Default TaskLeaseDefault (30 s).
	TaskLease time.Duration
	// MaxPayloadBytes bounds every JSON document the engine stores (input,
	// state, result, error detail). Larger ones are refused with
	// arbortype.ErrPayloadTooLarge. Default MaxPayloadBytesDefault (1 MiB).
	MaxPayloadBytes int
	// MaxErrorMessageBytes bounds a failure's message; a longer one is
	// truncated (at a UTF-8 boundary, marked with "…") rather than refused,
	// so a failure is never lost for its size. Default 8 KiB.
	MaxErrorMessageBytes int
	// RestartLimit is the restart_limit of tasks created without one: how
	// many recoveries a task survives. Default RestartLimitDefault (5).
	RestartLimit int
	// TxRetries is how many times a pool-form operation is retried after a
	// serialization failure or a deadlock (which arbor's locking order
	// should make impossible), at most 100. TxRetriesNone (-1) retries
	// none: the operation returns the database's error (arbortype.ErrDatabase) at
	// once. It does not bound the retries of a transient fault (a lost
	// connection, a server-side timeout), which UnavailableTimeout does.
	// Default (0) TxRetriesDefault (5).
	TxRetries int
	// RetryBackoffBase is the first retry's backoff for tasks created
	// without one (arbortype.CreateParams.RetryBackoffBase): retry n (from 0) waits
	// min(cap, base·2^n), jittered into its upper half. Default
	// RetryBackoffBaseDefault (1 s).
	RetryBackoffBase time.Duration
	// RetryBackoffCap bounds every backoff of tasks created without one.
	// Default RetryBackoffCapDefault (5 min).
	RetryBackoffCap time.Duration
	// ErrorHistoryLimit is how many failed runs a task's error history keeps
	// (the newest). Default ErrorHistoryLimitDefault (10).
	ErrorHistoryLimit int
	// UnavailableTimeout is how long an operation keeps retrying while the
	// database cannot be reached or keeps dropping the connection (a
	// failover, a restart, a proxy's idle timeout, an administrator's
	// pg_terminate_backend), before it gives up with arbortype.ErrUnavailable. Such a
	// fault shorter than this costs latency and is otherwise invisible: the
	// transaction had not committed, so it runs again as a whole. The
	// caller's context bounds it too. Default UnavailableTimeoutDefault
	// (30 s).
	UnavailableTimeout time.Duration
	// IdleInTransaction bounds how long one of the engine's own
	// transactions may sit idle between two statements before the server
	// ends its session (PostgreSQL's idle_in_transaction_session_timeout,
	// set for each transaction alone): the transaction is rolled back and
	// its row locks freed. Its statements follow one another at once, so
	// only a process that stopped mid-transaction (paused, frozen, starved)
	// reaches it; without it, such a process would keep the conversation
	// rows it had locked, and no runner could take its conversations over
	// after its lease expired, for as long as it stayed stopped. The engine
	// retries a transaction cut this way like any lost connection. Keep it
	// well below the runners' ConversationLease, so that a stopped holder's
	// conversations can be taken over when its lease expires. (A stopped
	// process's transaction that was waiting for a row lock another of its
	// transactions held starts to sit idle only once that one is ended, so
	// the last of its locks may go a few times this late.) Default
	// IdleInTransactionDefault (5 s).
	IdleInTransaction time.Duration
	// TurnPolicies gives, per kind of root task, what Create does when a
	// turn of that kind is created while another root task of the
	// conversation is live. A create whose arbortype.CreateParams.OnBusy names a
	// policy (arbortype.TurnQueue included) has that one instead; a kind missing here,
	// or given arbortype.TurnDefault, queues. Default: none.
	TurnPolicies map[string]arbortype.TurnPolicy
	// KindPriorities gives the priority of the tasks of a kind created
	// without one (arbortype.CreateParams.Priority 0), from -3600 to 3600:
	// say, 60 for the interactive turn, -60 for a background summary.
	// Default: none (0).
	KindPriorities map[string]int
	// LogRetention is how long a conversation's log entries are kept; the
	// runners prune older ones. Default LogRetentionDefault (7 days).
	LogRetention time.Duration
	// Retention is how long settled history is kept after it settled:
	// the runners' prune job (and Engine.Prune without OlderThan) deletes
	// whole conversations idle longer than this, and the turns of
	// conversations still in use that settled longer ago, except each
	// conversation's newest settled turn (docs/operations.md,
	// "Retention"). Default 0: history is kept forever and nothing is
	// pruned; set it (at least a minute) to prune.
	Retention time.Duration
	// PruneBatch is how many tasks one prune transaction deletes, with
	// their events, log entries and wake jobs. Default PruneBatchDefault
	// (500).
	PruneBatch int
	// PruneInterval is how often the runners' prune job runs when
	// Retention is set (River runs it on one node, its leader). Default
	// PruneIntervalDefault (1 hour).
	PruneInterval time.Duration
	// arbortype.TraceInjector, if not nil, gives every task the trace context of the
	// context it is created in (Create, CreateTx, CreateMany, CreateManyTx,
	// the turn policies' creates, and a handler's Spawn and SpawnMany), stored
	// with the task and restored by the runner's middleware on every run
	// (see arbortype.TraceInjector; otelarbor.Middleware is one). Default: none, and
	// tasks carry no trace context.
	TraceInjector arbortype.TraceInjector
	// TransactionPooler says that the engine's pool reaches PostgreSQL
	// through a pooler in transaction mode (PgBouncer's pool_mode =
	// transaction), where a client connection is one server session only
	// for the length of a transaction: session state does not last, and a
	// LISTEN through it hears nothing. Everything arbor does but LISTEN
	// works there. With it set, arbor LISTENs only on ListenPool; with no
	// ListenPool, nothing of arbor LISTENs: the runner, the waker and
	// Follow/AwaitSettled find news by their slow polls instead
	// (machine.RunnerConfig.PollInterval, machine.WakerConfig.PollInterval,
	// FollowPoll), and New logs a warning saying so. Either way the
	// Waker's River client runs poll-only (River's own LISTEN cannot be
	// moved to another pool). The pool must not use pgx's
	// prepared-statement cache (its default) unless the pooler keeps
	// prepared statements (PgBouncer 1.21+ with max_prepared_statements):
	// set its ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec (or
	// ...CacheDescribe, or default_query_exec_mode=exec in the URL); New
	// warns about a pool that does not. See docs/scaling.md. Default false.
	TransactionPooler bool
	// ListenPool is the pool arbor's LISTEN connections come from, when
	// they must not come from the engine's pool: behind a pooler in
	// transaction mode, a pool of direct connections to the same database.
	// A process holds one of its connections (the pool's one listener,
	// shared by the runners, the wakers and the engines' followers on
	// this pool) while any of them runs or follows.
	// The caller owns it, as the engine's pool. Default nil: the engine's
	// pool, or, with TransactionPooler, no LISTEN at all.
	ListenPool *pgxpool.Pool
	// Logger receives the engine's logs, and a runner's on the engine
	// unless machine.RunnerConfig.Logger names another. Default: warnings
	// and errors as text on standard error (slog.NewTextHandler(os.Stderr)
	// at slog.LevelWarn), as River's default logger does: what arbor warns
	// about (a pooler configuration that polls or will break, a handler
	// that ignores its cancelled context, a lease that could not be
	// renewed) needs an operator. slog.New(slog.DiscardHandler) discards
	// everything.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = migrations.SchemaDefault
	}
	if out.TaskLease == 0 {
		out.TaskLease = TaskLeaseDefault
	}
	if out.MaxPayloadBytes == 0 {
		out.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	if out.MaxErrorMessageBytes == 0 {
		out.MaxErrorMessageBytes = MaxErrorMessageBytesDefault
	}
	if out.RestartLimit == 0 {
		out.RestartLimit = RestartLimitDefault
	}
	if out.TxRetries == 0 {
		out.TxRetries = TxRetriesDefault
	}
	if out.RetryBackoffBase == 0 {
		out.RetryBackoffBase = RetryBackoffBaseDefault
	}
	if out.RetryBackoffCap == 0 {
		out.RetryBackoffCap = max(RetryBackoffCapDefault, out.RetryBackoffBase)
	}
	if out.ErrorHistoryLimit == 0 {
		out.ErrorHistoryLimit = ErrorHistoryLimitDefault
	}
	if out.UnavailableTimeout == 0 {
		out.UnavailableTimeout = UnavailableTimeoutDefault
	}
	if out.IdleInTransaction == 0 {
		out.IdleInTransaction = IdleInTransactionDefault
	}
	if out.LogRetention == 0 {
		out.LogRetention = LogRetentionDefault
	}
	if out.PruneBatch == 0 {
		out.PruneBatch = PruneBatchDefault
	}
	if out.PruneInterval == 0 {
		out.PruneInterval = PruneIntervalDefault
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return &out
}

func (c *Config) validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("Config.Schema: %w", err)
	}
	if c.TaskLease < time.Millisecond || c.TaskLease > 24*time.Hour {
		return fmt.Errorf("Config.TaskLease: %s is outside 1ms..24h", c.TaskLease)
	}
	if c.MaxPayloadBytes < 0 || c.MaxPayloadBytes > maxPayloadBytes {
		return fmt.Errorf("Config.MaxPayloadBytes: %d is outside 0..%d (PostgreSQL's limit on a jsonb value)", c.MaxPayloadBytes, maxPayloadBytes)
	}
	if c.MaxErrorMessageBytes < 16 {
		return fmt.Errorf("Config.MaxErrorMessageBytes: %d is below 16", c.MaxErrorMessageBytes)
	}
	if c.RestartLimit < 0 || c.RestartLimit > maxInt32 {
		return fmt.Errorf("Config.RestartLimit: %d is outside 0..%d", c.RestartLimit, maxInt32)
	}
	if c.TxRetries < TxRetriesNone || c.TxRetries > 100 {
		return fmt.Errorf("Config.TxRetries: %d is outside -1..100 (-1, TxRetriesNone: no retries)", c.TxRetries)
	}
	if err := core.ValidateBackoff(c.RetryBackoffBase, c.RetryBackoffCap); err != nil {
		return fmt.Errorf("Config.RetryBackoffBase/RetryBackoffCap: %w", err)
	}
	if c.ErrorHistoryLimit < 1 || c.ErrorHistoryLimit > 1000 {
		return fmt.Errorf("Config.ErrorHistoryLimit: %d is outside 1..1000", c.ErrorHistoryLimit)
	}
	if c.UnavailableTimeout < 0 || c.UnavailableTimeout > 24*time.Hour {
		return fmt.Errorf("Config.UnavailableTimeout: %s is outside 0..24h", c.UnavailableTimeout)
	}
	if c.IdleInTransaction < time.Millisecond || c.IdleInTransaction > 24*time.Hour {
		return fmt.Errorf("Config.IdleInTransaction: %s is outside 1ms..24h", c.IdleInTransaction)
	}
	for kind, p := range c.TurnPolicies {
		if !p.Valid() {
			return fmt.Errorf("Config.TurnPolicies[%q]: %q is not a policy", kind, p)
		}
	}
	for kind, p := range c.KindPriorities {
		if p < -core.MaxPriority || p > core.MaxPriority {
			return fmt.Errorf("Config.KindPriorities[%q]: %d is outside -%d..%d", kind, p, core.MaxPriority, core.MaxPriority)
		}
	}
	if c.LogRetention < time.Minute {
		return fmt.Errorf("Config.LogRetention: %s is below a minute", c.LogRetention)
	}
	if c.Retention != 0 && (c.Retention < time.Minute || c.Retention > 100*365*24*time.Hour) {
		return fmt.Errorf("Config.Retention: %s is outside 1m..100y (0 keeps history forever)", c.Retention)
	}
	if c.PruneBatch < 1 || c.PruneBatch > 100_000 {
		return fmt.Errorf("Config.PruneBatch: %d is outside 1..100000", c.PruneBatch)
	}
	if c.PruneInterval < time.Second || c.PruneInterval > 7*24*time.Hour {
		return fmt.Errorf("Config.PruneInterval: %s is outside 1s..7d", c.PruneInterval)
	}
	return nil
}

const (
	maxInt32        = 1<<31 - 1
	maxPayloadBytes = 255 << 20
)

// Engine runs arbor's operations on a pool the caller owns. It is safe for
// concurrent use and keeps no state between calls: PostgreSQL is the only
// authority.
type Engine struct {
	core *core.Engine
	// hub LISTENs for the log's followers while there are any (log.go).
	hub *hub
}

// New returns an Engine on pool. It refuses a schema that is not at the
// migration version this build knows, with an error naming both versions
// (errors.Is(err, migrations.ErrVersionMismatch)).
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, fmt.Errorf("tasks.New: pool is nil: %w", arbortype.ErrInvalidArgument)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tasks.New: %w: %w", arbortype.ErrInvalidArgument, err)
	}
	if err := migrations.Check(ctx, pool, cfg.Schema); err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	if cfg.ListenPool != nil {
		// The notifications come from the engine's database: a ListenPool
		// that reaches another would hear none of them.
		if err := migrations.Check(ctx, cfg.ListenPool, cfg.Schema); err != nil {
			return nil, fmt.Errorf("tasks.New: Config.ListenPool: %w", err)
		}
	}
	c, err := core.New(ctx, pool, core.Config(*cfg))
	if err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	if cfg.TransactionPooler {
		warnPooler(ctx, pool, cfg)
	}
	e := &Engine{core: c, hub: newHub(c)}
	core.Register(e, c)
	return e, nil
}

// warnPooler logs what a configuration behind a transaction-mode pooler
// gives up or risks: polling for lack of a ListenPool, and a pool whose
// prepared-statement cache the pooler may not keep.
func warnPooler(ctx context.Context, pool *pgxpool.Pool, cfg *Config) {
	if cfg.ListenPool == nil {
		cfg.Logger.WarnContext(ctx, "arbor: behind a transaction-mode pooler with no Config.ListenPool: nothing LISTENs; "+
			"the runner, the waker and followers poll instead (news arrives within their poll intervals, not at once)")
	}
	if pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		cfg.Logger.WarnContext(ctx, "arbor: behind a transaction-mode pooler the pool uses pgx's prepared-statement cache; "+
			"unless the pooler keeps prepared statements (PgBouncer 1.21+ with max_prepared_statements) set "+
			"ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec or default_query_exec_mode=exec in the URL")
	}
}

// Config returns the engine's configuration, with defaults filled in.
func (e *Engine) Config() Config { return Config(e.core.Cfg) }
