package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
)

// Retries (docs/design.md §3.5). A task's retry policy is max_retries with an
// exponential backoff (base, cap) stored on its row at create. When its
// runner fails it with an error that is not marked non-retryable and the
// task has retries left, the failure does not settle it: running →
// sleeping (event retry) until the backoff time, woken by the same wake job
// and timers as any sleep, retries + 1, the error recorded as the task's
// error and in its bounded error history. Its foreground children are left
// as they are (the contract aborts them only when the task fails for good):
// the handler resumes from its last checkpoint and may wait for them again.

// NonRetryable wraps err so that errors.Is(err, ErrNonRetryable) holds and
// NewTaskError marks it non-retryable; errors.Is and errors.As still see err.
// NonRetryable(nil) is nil.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRetryableError{err: err}
}

type nonRetryableError struct{ err error }

func (e *nonRetryableError) Error() string   { return e.err.Error() }
func (e *nonRetryableError) Unwrap() []error { return []error{e.err, arbortype.ErrNonRetryable} }

// NewTaskError returns the TaskError that records a handler's error: its
// message, and NonRetryable when errors.Is(err, ErrNonRetryable).
func NewTaskError(err error) TaskError {
	if err == nil {
		return TaskError{}
	}
	return TaskError{Message: err.Error(), NonRetryable: errors.Is(err, arbortype.ErrNonRetryable)}
}

// maxBackoff bounds a task's backoff settings: a retry further out than this
// is a schedule, not a retry.
const maxBackoff = 7 * 24 * time.Hour

func ValidateBackoff(base, ceiling time.Duration) error {
	switch {
	case (base > 0 && base < time.Microsecond) || (ceiling > 0 && ceiling < time.Microsecond):
		// The database keeps intervals in microseconds: a shorter one would
		// silently become no backoff at all.
		return fmt.Errorf("retry backoff base %s and cap %s must be 0 or at least 1µs: %w", base, ceiling, arbortype.ErrInvalidArgument)
	case base < 0 || ceiling < 0:
		return fmt.Errorf("retry backoff base %s and cap %s must not be negative: %w", base, ceiling, arbortype.ErrInvalidArgument)
	case ceiling < base:
		return fmt.Errorf("retry backoff cap %s is below its base %s: %w", ceiling, base, arbortype.ErrInvalidArgument)
	case ceiling > maxBackoff:
		return fmt.Errorf("retry backoff cap %s is over %s: %w", ceiling, maxBackoff, arbortype.ErrInvalidArgument)
	}
	return nil
}

// backoff returns the wait before retry number retry (from 0): the
// exponential delay d = min(ceiling, base·2^retry), jittered into its upper
// half, d/2 + jitter·d/2 with jitter in [0, 1) ("equal jitter"). Every task
// still waits at least half its nominal delay, and tasks that failed
// together spread over the other half instead of retrying in a herd.
func backoff(retry int, base, ceiling time.Duration, jitter float64) time.Duration {
	d := ceiling
	if retry < 62 && base > 0 && base <= ceiling>>retry {
		d = base << retry
	}
	if base == 0 {
		d = 0
	}
	half := d / 2
	return d - half + time.Duration(jitter*float64(half))
}

// retryIfAllowed parks t, locked and running, for a retry when its runner
// (fromRunner) failed it with a retryable error and it has retries left.
// ok says whether it did; otherwise the caller fails the task for good.
func (e *Engine) retryIfAllowed(ctx context.Context, tx pgx.Tx, t Task, fromRunner bool, recorded *TaskError) (Task, bool, error) {
	if !fromRunner || t.Status != arbortype.StatusRunning || recorded.NonRetryable || t.Retries >= t.MaxRetries {
		return Task{}, false, nil
	}
	to, err := fsm.Transition(t.Status, fsm.Retry)
	if err != nil {
		return Task{}, false, transitionError(t.ID, t.Status, fsm.Retry)
	}
	delay := backoff(t.Retries, t.RetryBackoffBase, t.RetryBackoffCap, rand.Float64())
	now, err := e.Store.TransactionNow(ctx, tx)
	if err != nil {
		return Task{}, false, err
	}
	wakeAt := now.Add(delay) // the database's clock, as the row's updated_at
	jobID, err := e.insertWakeJob(ctx, tx, t, wakeAt)
	if err != nil {
		return Task{}, false, err
	}
	parked, err := e.Store.RetryTask(ctx, tx, t.ConversationID, t.ID, to, recorded, wakeAt, e.Cfg.ErrorHistoryLimit, jobID)
	if err != nil {
		return Task{}, false, mapDBError(err)
	}
	if err := e.announceSleep(ctx, tx, parked); err != nil {
		return Task{}, false, err
	}
	return parked, true, nil
}
