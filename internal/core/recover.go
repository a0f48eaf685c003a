package core

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Recovery primitives, for internal/recovery, which decides what to apply.
// Each runs inside the caller's transaction, which must already hold the
// conversation's row lock (as the transaction that takes a conversation's
// lease does), and without a savepoint: recovery applies whole or not at all.

// RequeueMany puts the running tasks among ids, whose runs are over, back
// to pending (phase and state kept), in one statement, with attempt + 1
// when counted (their holder died or lost its lease: docs/design.md §3.8).
// It returns the ids it requeued (a task no longer running is left out).
func (e *Engine) RequeueMany(ctx context.Context, tx pgx.Tx, ids []int64, counted bool) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	// Every row the statement moves is running (its WHERE says so): one
	// edge, checked once.
	to, err := fsm.Transition(arbortype.StatusRunning, fsm.Recover)
	if err != nil {
		return nil, err
	}
	moved, err := e.Store.RecoverTasks(ctx, tx, ids, to, counted)
	if err != nil {
		return nil, fmt.Errorf("requeue %d tasks: %w", len(ids), mapDBError(err))
	}
	return moved, nil
}

// Abandon settles a task that must never be re-run after a crash
// (abandon_on_restart) as cancelled, with the error code
// "abandoned_on_restart": its live foreground children are aborted first and
// its owner is reconciled, as a user's cancel does.
func (e *Engine) Abandon(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
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
		Code: arbortype.CodeAbandonedOnRestart, Message: "abandoned on restart: the task must not run twice", NonRetryable: true})
	if err != nil {
		return Task{}, errorf("abandon", taskID, err)
	}
	return abandoned, nil
}

// AbandonRun settles, as Abandon does, a task whose run of token ended
// without its outcome and must not be entered again (a handler of an
// abandon_on_restart kind that returned a fault): fenced by the token, it
// does nothing and reports false once the task is no longer that run's.
func (e *Engine) AbandonRun(ctx context.Context, tx pgx.Tx, taskID, token int64) (bool, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return false, errorf("abandon", taskID, err)
	}
	if t.Status != arbortype.StatusRunning || t.Token != token {
		return false, nil
	}
	if _, err := e.Abandon(ctx, tx, taskID); err != nil {
		return false, err
	}
	return true, nil
}

// ForceFail fails a pending or running task without a runner's token and
// without a retry (recovery past the restart limit, a handler kind unknown
// past its grace period): its live foreground children are aborted first
// and its owner is reconciled.
func (e *Engine) ForceFail(ctx context.Context, tx pgx.Tx, taskID int64, taskErr TaskError) (Task, error) {
	taskErr.NonRetryable = true
	return e.Fail(ctx, tx, taskID, nil, taskErr)
}

// RepairWait re-evaluates the wait of a waiting task from scratch and
// applies it (fail_fast aborts, wake). It reports whether the task woke.
// Every settle applies waits in its own transaction, so this finds nothing
// to do unless a wait was written by something other than the engine.
func (e *Engine) RepairWait(ctx context.Context, tx pgx.Tx, conv string, taskID int64) (bool, error) {
	t, err := e.Store.LockTask(ctx, tx, conv, taskID)
	if err != nil {
		return false, errorf("repair wait", taskID, mapNotFound(err))
	}
	if t.Status != arbortype.StatusWaiting {
		return false, nil
	}
	woken, err := e.applyWait(ctx, tx, t, nil)
	if err != nil {
		return false, errorf("repair wait", taskID, err)
	}
	return woken, nil
}

// RepairCompleting completes a completing task whose foreground children
// are all settled (and reconciles its owner). It reports whether it did.
func (e *Engine) RepairCompleting(ctx context.Context, tx pgx.Tx, conv string, taskID int64) (bool, error) {
	t, err := e.Store.LockTask(ctx, tx, conv, taskID)
	if err != nil {
		return false, errorf("repair completing", taskID, mapNotFound(err))
	}
	if t.Status != arbortype.StatusCompleting {
		return false, nil
	}
	live, err := e.Store.HasLiveForegroundChildren(ctx, tx, conv, taskID)
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
		return arbortype.ErrNotFound
	}
	return err
}
