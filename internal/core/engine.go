package core

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
	"github.com/arborhq/arbor/store"
)

// Config is the engine's configuration, with every default already filled
// in and validated by package tasks (tasks.Config documents each field; the
// two structs have the same fields, so that one converts to the other).
type Config struct {
	Schema               string
	TaskLease            time.Duration
	MaxPayloadBytes      int
	MaxErrorMessageBytes int
	RestartLimit         int
	TxRetries            int
	RetryBackoffBase     time.Duration
	RetryBackoffCap      time.Duration
	ErrorHistoryLimit    int
	Logger               *slog.Logger
}

// maxTextBytes bounds conversation ids, kinds, phases, codes and
// idempotency keys.
const maxTextBytes = 200

// Engine runs arbor's operations on a pool the caller owns. It is safe for
// concurrent use and keeps no state between calls.
type Engine struct {
	Pool   *pgxpool.Pool
	Store  *store.Store
	Cfg    Config
	Logger *slog.Logger
	// wakeJobs inserts the River jobs that wake sleeping tasks; an
	// insert-only client, never started (see sleep.go).
	wakeJobs *river.Client[pgx.Tx]
}

// Of returns the engine behind a *tasks.Engine. Package tasks sets it; the
// packages that run tasks (machine, reconcile's callers) use it to reach the
// operations that are not on the user's Engine.
var Of func(engine any) *Engine

// New returns an engine on pool with cfg (defaults filled, validated).
func New(pool *pgxpool.Pool, cfg Config) (*Engine, error) {
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, err
	}
	wakeJobs, err := newWakeJobClient(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Engine{Pool: pool, Store: st, Cfg: cfg, Logger: cfg.Logger, wakeJobs: wakeJobs}, nil
}

// Tx runs fn in a transaction of its own and commits it, retrying the whole
// transaction after a serialization failure or a deadlock (at most
// Cfg.TxRetries times). A commit whose outcome is unknown is reported as
// ErrAmbiguous.
func Tx[T any](ctx context.Context, e *Engine, fn func(tx pgx.Tx) (T, error)) (T, error) {
	for try := 0; ; try++ {
		v, err := tryTx(ctx, e.Pool, fn)
		if err == nil || !retryable(err) || try >= e.Cfg.TxRetries {
			return v, err
		}
		e.Logger.WarnContext(ctx, "arbor: retrying transaction", slog.Int("try", try+1), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(time.Duration(try+1) * 5 * time.Millisecond):
		}
	}
}

func tryTx[T any](ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := pool.Begin(ctx)
	if err != nil {
		return zero, err
	}
	v, err := fn(tx)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return zero, err
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
			// The server answered (a refusal) or nothing was sent: not committed.
			return zero, err
		}
		return zero, fmt.Errorf("%w: %w", ErrAmbiguous, err)
	}
	return v, nil
}

// Savepoint runs fn inside the caller's transaction under a savepoint, so
// that a refused operation leaves the caller's transaction as it was.
func Savepoint[T any](ctx context.Context, tx pgx.Tx, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	sp, err := tx.Begin(ctx)
	if err != nil {
		return zero, err
	}
	v, err := fn(sp)
	if err != nil {
		_ = sp.Rollback(context.WithoutCancel(ctx))
		return zero, err
	}
	if err := sp.Commit(ctx); err != nil {
		return zero, err
	}
	return v, nil
}

// SQLSTATEs the engine acts on.
const (
	sqlStateSerializationFailure = "40001"
	sqlStateDeadlockDetected     = "40P01"
	sqlStateInvalidText          = "22P02" // invalid_text_representation (malformed JSON)
	sqlStateInvalidEscape        = "22P05" // untranslatable_character (\u0000 in jsonb)
	sqlStateInvalidJSONText      = "22032" // invalid_json_text
	sqlStateUnicodeEscape        = "22025" // invalid_escape_sequence
)

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == sqlStateSerializationFailure || pgErr.Code == sqlStateDeadlockDetected
}

// mapDBError turns the database's refusals into the engine's sentinels,
// keeping the database's error in the chain.
func mapDBError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case fsm.SQLStateInvalidTransition, fsm.SQLStateSettled, fsm.SQLStateImmutable, fsm.SQLStateInvalidInsert:
		return fmt.Errorf("%w: refused by the database: %w", ErrInvalidTransition, err)
	case sqlStateInvalidText, sqlStateInvalidEscape, sqlStateInvalidJSONText, sqlStateUnicodeEscape:
		return fmt.Errorf("%w: %w", ErrInvalidJSON, err)
	}
	return err
}
