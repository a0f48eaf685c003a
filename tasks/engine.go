package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/store"
)

// Task is one task row. See store.Task for its fields.
type Task = store.Task

// TaskError is the recorded error of a failed task.
type TaskError = store.TaskError

// WaitPolicy says when a waiting task wakes.
type WaitPolicy = store.WaitPolicy

const (
	AllSettled = store.AllSettled
	FailFast   = store.FailFast
)

// Defaults of Config.
const (
	LeaseDurationDefault        = 30 * time.Second
	MaxPayloadBytesDefault      = 1 << 20 // 1 MiB
	MaxErrorMessageBytesDefault = 8 << 10 // 8 KiB
	RestartLimitDefault         = 5
	TxRetriesDefault            = 5
	RetryBackoffBaseDefault     = time.Second
	RetryBackoffCapDefault      = 5 * time.Minute
	ErrorHistoryLimitDefault    = 10
	maxTextBytes                = 200 // conversation ids, kinds, phases, idempotency keys
)

// Config configures an Engine. The zero value of every field means its default.
type Config struct {
	// Schema is the schema arbor's tables live in. Default "arbor".
	Schema string
	// LeaseDuration is how long a start, a claim, a checkpoint or a heartbeat
	// lets a task run before its lease deadline. The deadline is computed
	// with the database's clock. Default LeaseDurationDefault (30 s).
	LeaseDuration time.Duration
	// MaxPayloadBytes bounds every JSON document the engine stores (input,
	// state, result, error detail). Larger ones are refused with
	// ErrPayloadTooLarge. Default MaxPayloadBytesDefault (1 MiB).
	MaxPayloadBytes int
	// MaxErrorMessageBytes bounds a failure's message; a longer one is
	// truncated (at a UTF-8 boundary, marked with "…") rather than refused,
	// so a failure is never lost for its size. Default 8 KiB.
	MaxErrorMessageBytes int
	// RestartLimit is the restart_limit of tasks created without one: how
	// many recoveries a task survives. Default RestartLimitDefault (5).
	RestartLimit int
	// TxRetries is how many times a pool-form operation is retried after a
	// serialization failure or a deadlock. Default TxRetriesDefault (5).
	TxRetries int
	// RetryBackoffBase is the first retry's backoff for tasks created
	// without one (CreateParams.RetryBackoffBase): retry n (from 0) waits
	// min(cap, base·2^n), jittered into its upper half. Default
	// RetryBackoffBaseDefault (1 s).
	RetryBackoffBase time.Duration
	// RetryBackoffCap bounds every backoff of tasks created without one.
	// Default RetryBackoffCapDefault (5 min).
	RetryBackoffCap time.Duration
	// ErrorHistoryLimit is how many failed runs a task's error history keeps
	// (the newest). Default ErrorHistoryLimitDefault (10).
	ErrorHistoryLimit int
	// Logger receives the engine's logs. Default: discard.
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
	if out.LeaseDuration == 0 {
		out.LeaseDuration = LeaseDurationDefault
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
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (c *Config) validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("Config.Schema: %w", err)
	}
	if c.LeaseDuration < time.Millisecond {
		return fmt.Errorf("Config.LeaseDuration: %s is below 1ms", c.LeaseDuration)
	}
	if c.MaxPayloadBytes < 0 {
		return fmt.Errorf("Config.MaxPayloadBytes: %d is negative", c.MaxPayloadBytes)
	}
	if c.MaxErrorMessageBytes < 16 {
		return fmt.Errorf("Config.MaxErrorMessageBytes: %d is below 16", c.MaxErrorMessageBytes)
	}
	if c.RestartLimit < 0 {
		return fmt.Errorf("Config.RestartLimit: %d is negative", c.RestartLimit)
	}
	if c.TxRetries < 0 {
		return fmt.Errorf("Config.TxRetries: %d is negative", c.TxRetries)
	}
	if err := validateBackoff(c.RetryBackoffBase, c.RetryBackoffCap); err != nil {
		return fmt.Errorf("Config.RetryBackoffBase/RetryBackoffCap: %w", err)
	}
	if c.ErrorHistoryLimit < 1 {
		return fmt.Errorf("Config.ErrorHistoryLimit: %d is below 1", c.ErrorHistoryLimit)
	}
	return nil
}

// Engine runs arbor's operations on a pool the caller owns. It is safe for
// concurrent use and keeps no state between calls.
type Engine struct {
	pool   *pgxpool.Pool
	store  *store.Store
	cfg    *Config
	logger *slog.Logger
	// wakeJobs inserts and finds the River jobs that wake sleeping tasks;
	// an insert-only client, never started (see sleep.go).
	wakeJobs *river.Client[pgx.Tx]
}

// New returns an Engine on pool. It refuses a schema that is not at the
// migration version this build knows, with an error naming both versions
// (errors.Is(err, migrations.ErrVersionMismatch)).
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	if err := migrations.Check(ctx, pool, cfg.Schema); err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	wakeJobs, err := newWakeJobClient(pool, cfg)
	if err != nil {
		return nil, fmt.Errorf("tasks.New: %w", err)
	}
	return &Engine{pool: pool, store: st, cfg: cfg, logger: cfg.Logger, wakeJobs: wakeJobs}, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return *e.cfg }

// Store returns the engine's store, for the packages above tasks
// (reconcile, machine) that run their own queries in the same schema.
func (e *Engine) Store() *store.Store { return e.store }

// Pool returns the pool the engine runs on.
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// inTx runs fn in a transaction of its own and commits it, retrying the
// whole transaction after a serialization failure or a deadlock. A commit
// whose outcome is unknown is reported as ErrAmbiguous.
func (e *Engine) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for try := 0; ; try++ {
		err := e.tryTx(ctx, fn)
		if err == nil || !retryable(err) || try >= e.cfg.TxRetries {
			return err
		}
		e.logger.WarnContext(ctx, "arbor: retrying transaction", slog.Int("try", try+1), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try+1) * 5 * time.Millisecond):
		}
	}
}

func (e *Engine) tryTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
			// The server answered (a refusal) or nothing was sent: not committed.
			return err
		}
		return fmt.Errorf("%w: %v", ErrAmbiguous, err)
	}
	return nil
}

// inSavepoint runs fn inside the caller's transaction under a savepoint, so
// that a refused operation leaves the caller's transaction as it was.
func inSavepoint(ctx context.Context, tx pgx.Tx, fn func(tx pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(sp); err != nil {
		_ = sp.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return sp.Commit(ctx)
}

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "40001" || pgErr.Code == "40P01"
}

// mapDBError turns the database's refusals into the engine's sentinels.
func mapDBError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case fsm.SQLStateInvalidTransition, fsm.SQLStateSettled, fsm.SQLStateImmutable, fsm.SQLStateInvalidInsert:
		return fmt.Errorf("%w: refused by the database: %s", ErrInvalidTransition, pgErr.Message)
	case "22P02", "22P05", "22025": // invalid text representation / unsupported unicode escape
		return fmt.Errorf("%w: %s", ErrInvalidJSON, pgErr.Message)
	}
	return err
}
