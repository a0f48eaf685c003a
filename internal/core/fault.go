package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
)

// Faults. An operation's transaction can fail three ways that are not the
// caller's doing:
//
//   - transiently, before it committed: the connection was refused, lost or
//     terminated (a failover, a proxy or database restart, an idle timeout,
//     pg_terminate_backend, the server ending a session left idle in a
//     transaction past Cfg.IdleInTransaction, or idle outside one past the
//     role's idle_session_timeout, or in one past its transaction_timeout),
//     the server was starting or shutting down, or it had no connection
//     slot free; or the server cut a statement on its own (the role's
//     statement_timeout or lock_timeout, or pg_cancel_backend), which rolls
//     it back. Nothing was written. Tx runs the whole transaction again,
//     with jittered backoff, until it succeeds, the caller's context ends,
//     or Cfg.UnavailableTimeout has passed since the first failure (then
//     ErrUnavailable);
//   - by a serialization failure or a deadlock, which the locking order
//     should make impossible: retried Cfg.TxRetries times (-1, none);
//   - while COMMIT was in flight, with no answer: the transaction may or may
//     not have committed, and only the caller can find out
//     (ErrAmbiguous). A FATAL answer to COMMIT is ambiguous too: the
//     server processes a termination only after the commit record is
//     written, so it may come after a successful commit.
//
// Every error that leaves the engine wraps an arbor sentinel (arbortype's
// Err…), or is the caller's own context error; a database error arbor does
// not map is ErrDatabase, with the database's error in the chain.

// SQLSTATEs of transient faults: the connection or the server, not the
// transaction.
const (
	sqlStateAdminShutdown      = "57P01" // terminated by an administrator (pg_terminate_backend, shutdown)
	sqlStateCrashShutdown      = "57P02" // another backend crashed; the server restarts
	sqlStateCannotConnectNow   = "57P03" // the server is starting up or shutting down
	sqlStateTooManyConnections = "53300"
	// The session sat idle in a transaction past
	// idle_in_transaction_session_timeout (Cfg.IdleInTransaction): the
	// server ended it while waiting for the next command, so the
	// transaction was rolled back before any COMMIT was read.
	sqlStateIdleInTransactionTimeout = "25P03"
	// The session sat idle outside a transaction past the role's
	// idle_session_timeout: the server ended it before the statement that
	// finds out was read, so that statement never ran.
	sqlStateIdleSessionTimeout = "57P05"
	// The session stayed in one transaction past the role's
	// transaction_timeout (PostgreSQL 17): the server ended it. Like any
	// FATAL, one in answer to COMMIT may come after the commit.
	sqlStateTransactionTimeout = "25P04"
	// The server cancelled the statement on its own: statement_timeout, or
	// an administrator's pg_cancel_backend. The statement, and the
	// transaction around it, did not commit. When the caller's context
	// has ended, a cancel may be the driver's (a pool configured to send
	// cancel requests, pgconn.CancelRequestContextWatcherHandler): that is
	// the context's end, never a fault (see transient's callers).
	sqlStateQueryCanceled = "57014"
	// A lock was not granted within the role's lock_timeout: the statement,
	// and the transaction around it, did not commit. (arbor itself never
	// uses NOWAIT, which fails the same way.)
	sqlStateLockNotAvailable = "55P03"
	sqlStateClassConnection  = "08" // connection exception
)

// transient reports whether err says that the database could not be
// reached or dropped the connection, or cut the statement on its own (a
// server-side timeout): the transaction that got it did not commit (it
// never reached COMMIT, or its COMMIT was answered with an ERROR), so it
// may run again as a whole. A FATAL in answer to COMMIT is the caller's to
// tell apart (commitAnswered): it may come after the commit.
//
// A server-side timeout is the server's, not the caller's, only while the
// caller's context lasts: every caller checks ctx.Err() first (classify
// reports the context's error, retrier.again stops), since a pool may be
// configured to cancel a statement whose context ended by a cancel request,
// which the server answers with the same 57014.
//
// A context's end is not a fault: context.Canceled and
// context.DeadlineExceeded, and every error that wraps one, are the
// caller's (DeadlineExceeded would pass for a fault otherwise: it is a
// net.Error). The one exception is a connection that could not be made
// (*pgconn.ConnectError): its deadline is the connect's own
// (connect_timeout), a server that did not answer; a connect that the
// caller's context ended is not retried anyway, since every retry stops
// once that context is done.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if contextError(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlStateAdminShutdown, sqlStateCrashShutdown, sqlStateCannotConnectNow, sqlStateTooManyConnections,
			sqlStateIdleInTransactionTimeout, sqlStateIdleSessionTimeout, sqlStateTransactionTimeout,
			sqlStateQueryCanceled, sqlStateLockNotAvailable:
			return true
		}
		return strings.HasPrefix(pgErr.Code, sqlStateClassConnection)
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// contextError reports whether err is, or wraps, a context's end.
func contextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// commitAnswered reports whether a failed COMMIT got an answer that says
// it did not commit: an ERROR (not FATAL) from the server, the end of a
// session idle in its transaction or idle outside one (ended before the
// COMMIT, or the one statement, was read), or a failure before anything
// was sent.
func commitAnswered(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "ERROR" || pgErr.SeverityUnlocalized == "ERROR" ||
			pgErr.Code == sqlStateIdleInTransactionTimeout || pgErr.Code == sqlStateIdleSessionTimeout
	}
	return pgconn.SafeToRetry(err)
}

// sentinels are the errors every error of the engine wraps: every Err… of
// arbortype (TestEverySentinelIsListed fails on one left out, which
// classify would report as ErrDatabase), and the engine's own ErrNotDue.
var sentinels = []error{
	arbortype.ErrNotFound, arbortype.ErrInvalidTransition, arbortype.ErrInvalidArgument, arbortype.ErrInvalidJSON,
	arbortype.ErrPayloadTooLarge, arbortype.ErrOwnerNotLive, arbortype.ErrOwnerCompleting, arbortype.ErrOwnerAborting,
	arbortype.ErrForeignOwner, arbortype.ErrIdempotencyConflict, arbortype.ErrAlreadyRunning, arbortype.ErrNotRunning,
	arbortype.ErrLeaseLost, arbortype.ErrAborted, arbortype.ErrNotChild, arbortype.ErrLeaseHeld, arbortype.ErrForeignTask,
	arbortype.ErrNotSleeping, arbortype.ErrSettled, arbortype.ErrAwaitEnded, arbortype.ErrBusy, arbortype.ErrConcurrencyLimit, arbortype.ErrNotSettled, arbortype.ErrNotRoot,
	arbortype.ErrConversationExists, arbortype.ErrUnavailable, arbortype.ErrPermissionDenied, arbortype.ErrDatabase, arbortype.ErrAmbiguous,
	arbortype.ErrNonRetryable, arbortype.ErrBudgetExhausted, arbortype.ErrUnknownCounter,
	ErrNotDue,
}

// IsArborError reports whether err wraps one of arbor's sentinels.
func IsArborError(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// classify gives an error leaving the engine its sentinel: arbor's own
// errors and the caller's context errors as they are, a transient fault as
// ErrUnavailable, anything else as ErrDatabase (after mapping the database's
// refusals that are the caller's input, see mapDBError).
func classify(ctx context.Context, err error) error {
	if err == nil || IsArborError(err) {
		return err
	}
	if ctxErr := ctx.Err(); ctxErr != nil && (contextError(err) || transient(err)) {
		if errors.Is(err, ctxErr) {
			return err
		}
		return fmt.Errorf("%w (after: %w)", ctxErr, err)
	}
	if err = mapDBError(err); IsArborError(err) {
		return err
	}
	if transient(err) {
		return fmt.Errorf("%w: %w", arbortype.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", arbortype.ErrDatabase, err)
}

// faultBackoff is the wait before the try'th retry (from 0) of a transient
// fault: 10 ms doubling to at most a second, jittered over its whole range
// so that the nodes a failover cut off do not come back in a herd.
func faultBackoff(try int) time.Duration {
	d := time.Second
	if try < 7 {
		d = 10 * time.Millisecond << try
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// retrier counts the retries of one operation.
type retrier struct {
	e            *Engine
	firstFault   time.Time
	faults       int
	conflicts    int
	lastTransErr error
}

// again reports whether the operation should run again after err, having
// waited for the backoff; it returns the error to give up with otherwise.
func (r *retrier) again(ctx context.Context, err error) (bool, error) {
	switch {
	case errors.Is(err, arbortype.ErrAmbiguous):
		// The connection error in its chain is not a transient fault: the
		// transaction may have committed, and running it again could apply
		// it twice. Only the caller can find out.
		return false, err
	case transient(err) && ctx.Err() == nil:
		if r.faults == 0 {
			r.firstFault = time.Now()
		}
		r.lastTransErr = err
		if time.Since(r.firstFault) >= r.e.Cfg.UnavailableTimeout {
			return false, fmt.Errorf("%w: still failing after %s (%d tries): %w",
				arbortype.ErrUnavailable, r.e.Cfg.UnavailableTimeout, r.faults+1, err)
		}
		wait := faultBackoff(r.faults)
		r.faults++
		return sleepCtx(ctx, wait), err
	case retryable(err) && r.conflicts < r.e.Cfg.TxRetries && ctx.Err() == nil:
		r.conflicts++
		return sleepCtx(ctx, time.Duration(r.conflicts)*5*time.Millisecond), err
	}
	return false, err
}

// sleepCtx waits for d, or until ctx ends; it reports whether it waited.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
