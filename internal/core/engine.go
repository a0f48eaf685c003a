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

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/store"
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
	UnavailableTimeout   time.Duration
	IdleInTransaction    time.Duration
	TurnPolicies         map[string]arbortype.TurnPolicy
	KindPriorities       map[string]int
	LogRetention         time.Duration
	Retention            time.Duration
	PruneBatch           int
	PruneInterval        time.Duration
	TraceInjector        arbortype.TraceInjector
	TransactionPooler    bool
	ListenPool           *pgxpool.Pool
	Logger               *slog.Logger
}

// Trace returns the trace context a create in ctx stores with its tasks:
// the injector's, or nil without one.
func (e *Engine) Trace(ctx context.Context) map[string]string {
	if e.Cfg.TraceInjector == nil {
		return nil
	}
	return e.Cfg.TraceInjector.InjectTrace(ctx)
}

// Listener returns the pool arbor's LISTEN connections come from: the
// configured ListenPool, else the engine's pool as the application made it
// (a Runner's copy on its own pools listens on the application's, so that
// the runner, its waker and the engine's followers share one listener of
// internal/notify), or nil behind a pooler in
// transaction mode with no ListenPool, where nothing may LISTEN (a LISTEN
// through it would hear nothing) and the listeners poll instead.
func (e *Engine) Listener() *pgxpool.Pool {
	switch {
	case e.Cfg.ListenPool != nil:
		return e.Cfg.ListenPool
	case e.Cfg.TransactionPooler:
		return nil
	default:
		return e.appPool
	}
}

// maxTextBytes bounds conversation ids, kinds, phases, codes and
// idempotency keys.
const maxTextBytes = 200

// maxInt32 bounds the integer settings stored in integer columns.
const maxInt32 = 1<<31 - 1

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
	// txOptions begin every transaction of the engine's own (see TxOptions).
	txOptions pgx.TxOptions
	// announcer sends the change channel's notifications of one-statement
	// creates, after their commits (see announce.go).
	announcer *announcer
	// appPool is the pool New was given, which WithPool keeps.
	appPool *pgxpool.Pool
	// starters are the runners of this process that may start a root task
	// in its create (start.go).
	starters *starters
}

// New returns an engine on pool with cfg (defaults filled, validated). It
// asks the server its version, for the settings its transactions begin
// with (see TxOptions).
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Engine, error) {
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, err
	}
	wakeJobs, err := newWakeJobClient(pool, cfg)
	if err != nil {
		return nil, err
	}
	e := &Engine{Pool: pool, Store: st, Cfg: cfg, Logger: cfg.Logger, wakeJobs: wakeJobs, announcer: &announcer{}, appPool: pool, starters: &starters{}}
	// A read, run again after a transient fault as every read is (a
	// session the server ended while it sat idle in the pool, say).
	version, err := Read(ctx, e, func(db store.DB) (int, error) {
		var v int
		err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the server's version: %w", err)
	}
	e.txOptions = pgx.TxOptions{BeginQuery: beginQuery(cfg.IdleInTransaction, version)}
	return e, nil
}

// beginQuery is the statement that begins each transaction of the
// engine's own (see TxOptions) on a server of version (server_version_num):
// one round trip, since a query without arguments goes by the simple
// protocol, which takes every statement at once.
//
// Besides the idle limit arbor depends on, it lifts, for this transaction
// alone (SET LOCAL), the limits a role or database may set for the
// application's statements: statement_timeout, lock_timeout and, from
// PostgreSQL 17, transaction_timeout. arbor's transactions wait for a
// conversation's row lock by design (the conversation serializes its
// writes, and an application transaction may hold it), and some of them
// are long by nature (the abort of a large tree); cut by such a limit,
// each would be tried again and cut again until ErrUnavailable. They are
// bounded instead by the caller's context, and a stopped process's by
// idleInTransaction. (A one-statement write or a read, which has no
// transaction of arbor's to set them in, keeps them: one that a limit cuts
// is tried again, see transient.)
func beginQuery(idleInTransaction time.Duration, version int) string {
	q := fmt.Sprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %d; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0",
		max(idleInTransaction.Milliseconds(), 1))
	if version >= 170000 {
		q += "; SET LOCAL transaction_timeout = 0"
	}
	return q
}

// WithPool returns the engine running its transactions on pool instead,
// sharing everything else with e: a Runner's own connections (its work
// pool, its renewer's), so that the runner and the application never wait
// for each other's connections.
func (e *Engine) WithPool(pool *pgxpool.Pool) *Engine {
	c := *e
	c.Pool = pool
	return &c
}

// TxOptions begin a transaction of the engine's own: one whose session the
// server ends if it sits idle between two statements for
// Cfg.IdleInTransaction, so that a process stopped in the middle of it
// (paused, frozen) does not keep its row locks — the conversation rows
// above all, which a take-over must lock once the stopped holder's lease
// expired — and which the role's statement_timeout, lock_timeout and
// transaction_timeout do not cut (see beginQuery). Every transaction arbor
// opens on its pool begins with them.
func (e *Engine) TxOptions() pgx.TxOptions { return e.txOptions }

// Tx runs fn in a transaction of its own and commits it. The whole
// transaction runs again after a transient fault (see fault.go) until the
// caller's context ends or Cfg.UnavailableTimeout passes (ErrUnavailable),
// and after a serialization failure or a deadlock, Cfg.TxRetries times. A
// commit whose outcome is unknown is ErrAmbiguous. Every error it returns
// wraps an arbor sentinel, or is the caller's context error.
func Tx[T any](ctx context.Context, e *Engine, fn func(tx pgx.Tx) (T, error)) (T, error) {
	r := retrier{e: e}
	for {
		v, err := tryTx(ctx, e, fn)
		if err == nil {
			return v, nil
		}
		again, err := r.again(ctx, err)
		if !again {
			return v, classify(ctx, err)
		}
		e.Logger.DebugContext(ctx, "arbor: retrying transaction", slog.Int("faults", r.faults), slog.Int("conflicts", r.conflicts), slog.String("error", err.Error()))
	}
}

// Read runs one read on the pool, retried after a transient fault like Tx.
func Read[T any](ctx context.Context, e *Engine, fn func(db store.DB) (T, error)) (T, error) {
	r := retrier{e: e}
	for {
		v, err := fn(e.Pool)
		if err == nil {
			return v, nil
		}
		again, err := r.again(ctx, err)
		if !again {
			return v, classify(ctx, err)
		}
	}
}

// Write runs fn, one statement that writes and commits on its own (an
// implicit transaction), on a connection of the pool. The connection is
// acquired first, so that a failure to get one — the pool's wait ended by
// ctx, a connect refused — is told apart from a failure of the statement:
// nothing was sent then, and it is ctx's error, or retried like Tx's
// (ErrUnavailable once Cfg.UnavailableTimeout has passed). A fault before
// the statement was sent, or an ERROR the server answered with (the
// statement rolled back), is retried the same way. A fault after it was
// sent — the connection lost, a FATAL, ctx ended while the answer was
// awaited — may have come after its commit: ErrAmbiguous, never retried.
func Write[T any](ctx context.Context, e *Engine, fn func(db store.DB) (T, error)) (T, error) {
	r := retrier{e: e}
	for {
		v, err := writeOnce(ctx, e, fn)
		if err == nil || errors.Is(err, arbortype.ErrAmbiguous) {
			return v, err
		}
		again, err := r.again(ctx, err)
		if !again {
			return v, classify(ctx, err)
		}
	}
}

// writeOnce is one try of Write.
func writeOnce[T any](ctx context.Context, e *Engine, fn func(db store.DB) (T, error)) (T, error) {
	conn, err := e.Pool.Acquire(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer conn.Release()
	v, err := fn(conn)
	if err != nil && !commitAnswered(err) && (transient(err) || contextError(err)) {
		return v, fmt.Errorf("%w: %w", arbortype.ErrAmbiguous, err)
	}
	return v, err
}

// ReadIn runs one read on db (the caller's transaction) without retrying,
// its error given arbor's sentinel like Tx's.
func ReadIn[T any](ctx context.Context, db store.DB, fn func(db store.DB) (T, error)) (T, error) {
	v, err := fn(db)
	return v, classify(ctx, err)
}

func tryTx[T any](ctx context.Context, e *Engine, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := e.Pool.BeginTx(ctx, e.txOptions)
	if err != nil {
		return zero, err
	}
	v, err := fn(tx)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return zero, err
	}
	if err := tx.Commit(ctx); err != nil {
		if commitAnswered(err) {
			// The server answered with an ERROR, or nothing was sent: not
			// committed.
			return zero, err
		}
		return zero, fmt.Errorf("%w: %w", arbortype.ErrAmbiguous, err)
	}
	return v, nil
}

// Savepoint runs fn inside the caller's transaction under a savepoint, so
// that a refused operation leaves the caller's transaction as it was. It
// never retries (the transaction is the caller's); its errors wrap arbor's
// sentinels like Tx's.
func Savepoint[T any](ctx context.Context, tx pgx.Tx, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	sp, err := tx.Begin(ctx)
	if err != nil {
		return zero, classify(ctx, err)
	}
	v, err := fn(sp)
	if err != nil {
		_ = sp.Rollback(context.WithoutCancel(ctx))
		return zero, classify(ctx, err)
	}
	if err := sp.Commit(ctx); err != nil {
		return zero, classify(ctx, err)
	}
	return v, nil
}

// SQLSTATEs the engine acts on.
const (
	sqlStateSerializationFailure  = "40001"
	sqlStateDeadlockDetected      = "40P01"
	sqlStateInvalidText           = "22P02" // invalid_text_representation (malformed JSON)
	sqlStateInvalidEscape         = "22P05" // untranslatable_character (\u0000 in jsonb)
	sqlStateInvalidJSONText       = "22032" // invalid_json_text
	sqlStateUnicodeEscape         = "22025" // invalid_escape_sequence
	sqlStateNotInRepertoire       = "22021" // character_not_in_repertoire (invalid UTF-8)
	sqlStateNumericOutOfRange     = "22003" // numeric_value_out_of_range (1e1000000 in jsonb)
	sqlStateProgramLimit          = "54000" // program_limit_exceeded (a value over 256 MB)
	sqlStateInsufficientPrivilege = "42501" // the role lacks a grant
)

// retryable reports whether err is a serialization failure or a deadlock.
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
	case guardrules.SQLStateInvalidTransition, guardrules.SQLStateSettled, guardrules.SQLStateImmutable, guardrules.SQLStateInvalidInsert,
		guardrules.SQLStateColumn, guardrules.SQLStateDelete, guardrules.SQLStateConversation, guardrules.SQLStateFork, guardrules.SQLStateRecord:
		return fmt.Errorf("%w: refused by the database: %w", arbortype.ErrInvalidTransition, err)
	case sqlStateInvalidText, sqlStateInvalidEscape, sqlStateInvalidJSONText, sqlStateUnicodeEscape,
		sqlStateNotInRepertoire, sqlStateNumericOutOfRange:
		return fmt.Errorf("%w: %w", arbortype.ErrInvalidJSON, err)
	case sqlStateProgramLimit:
		return fmt.Errorf("%w: %w", arbortype.ErrPayloadTooLarge, err)
	case sqlStateInsufficientPrivilege:
		return fmt.Errorf("%w: %w", arbortype.ErrPermissionDenied, err)
	}
	return err
}
