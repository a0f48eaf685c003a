package tasks

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Fail ends the run holding token with a failure: the task becomes failed
// with taskErr recorded (its message truncated to
// Config.MaxErrorMessageBytes, its detail JSON checked against
// Config.MaxPayloadBytes) and added to its error history, its live
// foreground children are aborted first (bottom-up), and its owner is
// reconciled (fail_fast or all_settled) in the same transaction.
//
// A task with retries left (CreateParams.MaxRetries) whose taskErr is not
// NonRetryable is not failed: it sleeps until its backoff time (see
// retry.go), with retries + 1 and taskErr recorded, and is woken like any
// sleep.
//
// Fenced like Checkpoint: ErrLeaseLost, ErrNotRunning or ErrAborted, and
// nothing is written.
func (e *Engine) Fail(ctx context.Context, taskID, token int64, taskErr TaskError) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.fail(ctx, tx, taskID, &token, taskErr)
		return err
	})
	return task, err
}

// FailTx is Fail inside the caller's transaction.
func (e *Engine) FailTx(ctx context.Context, tx pgx.Tx, taskID, token int64, taskErr TaskError) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.fail(ctx, tx, taskID, &token, taskErr)
		return err
	})
	return task, err
}

func (e *Engine) fail(ctx context.Context, tx pgx.Tx, taskID int64, token *int64, taskErr TaskError) (Task, error) {
	recorded, err := e.boundedError(taskErr)
	if err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	if token != nil {
		if err := checkHolder(t, *token); err != nil {
			return Task{}, errorf("fail", taskID, err)
		}
	}
	if _, err := fsm.Transition(t.Status, fsm.Fail); err != nil {
		return Task{}, errorf("fail", taskID, transitionError(taskID, t.Status, fsm.Fail))
	}
	if retried, ok, err := e.retryIfAllowed(ctx, tx, t, token != nil, recorded); ok || err != nil {
		if err != nil {
			return Task{}, errorf("fail", taskID, err)
		}
		return retried, nil
	}
	if err := e.recordFailure(ctx, tx, t, recorded); err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	if err := e.abortForegroundChildren(ctx, tx, t); err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	failed, err := e.settle(ctx, tx, t, fsm.Fail, nil, recorded)
	if err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	return failed, nil
}
