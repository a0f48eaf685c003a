package tasks

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Cancel is a user's cancel of a pending, running, waiting or sleeping task:
// its live foreground children are aborted first (each subtree bottom-up),
// then the task becomes cancelled with result (optional) recorded, then its
// owner is reconciled, all in one transaction. A completing or settled task
// cannot be cancelled (*TransitionError); an unknown one is ErrNotFound.
// A runner executing the task learns it at its next write (ErrNotRunning).
func (e *Engine) Cancel(ctx context.Context, taskID int64, result json.RawMessage) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.cancel(ctx, tx, taskID, result)
		return err
	})
	return task, err
}

// CancelTx is Cancel inside the caller's transaction.
func (e *Engine) CancelTx(ctx context.Context, tx pgx.Tx, taskID int64, result json.RawMessage) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.cancel(ctx, tx, taskID, result)
		return err
	})
	return task, err
}

func (e *Engine) cancel(ctx context.Context, tx pgx.Tx, taskID int64, result json.RawMessage) (Task, error) {
	if err := e.checkJSON("result", result); err != nil {
		return Task{}, errorf("cancel", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("cancel", taskID, err)
	}
	if _, err := fsm.Transition(t.Status, fsm.Cancel); err != nil {
		return Task{}, errorf("cancel", taskID, transitionError(taskID, t.Status, fsm.Cancel))
	}
	if err := e.abortForegroundChildren(ctx, tx, t); err != nil {
		return Task{}, errorf("cancel", taskID, err)
	}
	cancelled, err := e.settle(ctx, tx, t, fsm.Cancel, result, nil)
	if err != nil {
		return Task{}, errorf("cancel", taskID, err)
	}
	return cancelled, nil
}
