package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// Recovery primitives, for package reconcile. Each runs inside the caller's
// transaction, which must already hold the conversation's row lock (as the
// transaction that takes a conversation's lease does), and without a
// savepoint: recovery either applies whole or not at all.

// Failure codes recorded by recovery and by the runner.
const (
	CodeRestartLimitExceeded = "restart_limit_exceeded"
	CodeAbandonedOnRestart   = "abandoned_on_restart"
	CodeUnknownKind          = "unknown_kind"
)

// RequeueTx puts a running task whose holder died back to pending with
// attempt + 1; its phase and state are kept.
func (e *Engine) RequeueTx(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	t, err := e.store.LockTask(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("requeue", taskID, mapNotFound(err))
	}
	to, err := fsm.Transition(t.Status, fsm.Recover)
	if err != nil {
		return Task{}, errorf("requeue", taskID, transitionError(taskID, t.Status, fsm.Recover))
	}
	requeued, err := e.store.RecoverTask(ctx, tx, taskID, to)
	if err != nil {
		return Task{}, errorf("requeue", taskID, mapDBError(err))
	}
	return requeued, nil
}

// RequeueManyTx is RequeueTx for many tasks in one statement: the running
// ones among ids go back to pending with attempt + 1. It returns the ids it
// requeued (a task no longer running is left out).
func (e *Engine) RequeueManyTx(ctx context.Context, tx pgx.Tx, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	// Every row the statement moves is running (its WHERE says so): one
	// edge, checked once.
	to, err := fsm.Transition(fsm.Running, fsm.Recover)
	if err != nil {
		return nil, err
	}
	moved, err := e.store.RecoverTasks(ctx, tx, ids, to)
	if err != nil {
		return nil, fmt.Errorf("requeue %d tasks: %w", len(ids), mapDBError(err))
	}
	return moved, nil
}

// AbandonTx settles a task that must never be re-run after a crash
// (abandon_on_restart) as cancelled, with the error code
// "abandoned_on_restart": its live foreground children are aborted first and
// its owner is reconciled, as a user's cancel does.
func (e *Engine) AbandonTx(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("abandon", taskID, err)
	}
	if _, err := fsm.Transition(t.Status, fsm.Cancel); err != nil {
		return Task{}, errorf("abandon", taskID, transitionError(taskID, t.Status, fsm.Cancel))
	}
	if err := e.abortForegroundChildren(ctx, tx, t); err != nil {
		return Task{}, errorf("abandon", taskID, err)
	}
	abandoned, err := e.settle(ctx, tx, t, fsm.Cancel, nil, &TaskError{
		Code: CodeAbandonedOnRestart, Message: "abandoned on restart: the task must not run twice", NonRetryable: true})
	if err != nil {
		return Task{}, errorf("abandon", taskID, err)
	}
	return abandoned, nil
}

// ForceFail fails a pending or running task without a runner's token and
// without a retry (recovery past the restart limit, a handler kind unknown
// past its grace period, an operator): its live foreground children are
// aborted first and its owner is reconciled.
func (e *Engine) ForceFail(ctx context.Context, taskID int64, taskErr TaskError) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.ForceFailTx(ctx, tx, taskID, taskErr)
		return err
	})
	return task, err
}

// ForceFailTx is ForceFail inside the caller's transaction.
func (e *Engine) ForceFailTx(ctx context.Context, tx pgx.Tx, taskID int64, taskErr TaskError) (Task, error) {
	taskErr.NonRetryable = true
	return e.fail(ctx, tx, taskID, nil, taskErr)
}

// RepairWaitTx re-evaluates the wait of a waiting task from scratch and
// applies it (fail_fast aborts, wake). It reports whether the task woke.
// Every settle applies waits in its own transaction, so this finds nothing
// to do unless a wait was written by something other than the engine.
func (e *Engine) RepairWaitTx(ctx context.Context, tx pgx.Tx, taskID int64) (bool, error) {
	t, err := e.store.LockTask(ctx, tx, taskID)
	if err != nil {
		return false, errorf("repair wait", taskID, mapNotFound(err))
	}
	if t.Status != fsm.Waiting {
		return false, nil
	}
	woken, err := e.applyWait(ctx, tx, t, nil)
	if err != nil {
		return false, errorf("repair wait", taskID, err)
	}
	return woken, nil
}

// RepairCompletingTx completes a completing task whose foreground children
// are all settled (and reconciles its owner). It reports whether it did.
func (e *Engine) RepairCompletingTx(ctx context.Context, tx pgx.Tx, taskID int64) (bool, error) {
	t, err := e.store.LockTask(ctx, tx, taskID)
	if err != nil {
		return false, errorf("repair completing", taskID, mapNotFound(err))
	}
	if t.Status != fsm.Completing {
		return false, nil
	}
	live, err := e.store.HasLiveForegroundChildren(ctx, tx, taskID)
	if err != nil || live {
		return false, err
	}
	if _, err := e.settle(ctx, tx, t, fsm.Complete, nil, nil); err != nil {
		return false, errorf("repair completing", taskID, err)
	}
	return true, nil
}

func mapNotFound(err error) error {
	if err != nil && store.IsNoRows(err) {
		return ErrNotFound
	}
	return err
}
