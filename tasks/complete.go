package tasks

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Complete ends the run holding token with result. A task whose foreground
// children are all settled becomes completed, and its owner is reconciled in
// the same transaction: a waiting owner may wake, a completing owner whose
// last foreground child this was becomes completed, and so on up the tree.
// A task with live foreground children becomes completing instead: it holds
// result and completes when its last foreground child settles. Background
// children never hold it.
//
// Fenced like Checkpoint: ErrLeaseLost, ErrNotRunning or ErrAborted, and
// nothing is written.
func (e *Engine) Complete(ctx context.Context, taskID, token int64, result json.RawMessage) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.complete(ctx, tx, taskID, &token, result)
		return err
	})
	return task, err
}

// CompleteTx is Complete inside the caller's transaction.
func (e *Engine) CompleteTx(ctx context.Context, tx pgx.Tx, taskID, token int64, result json.RawMessage) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.complete(ctx, tx, taskID, &token, result)
		return err
	})
	return task, err
}

// complete checks the holder's token unless token is nil (an operator's
// Transition).
func (e *Engine) complete(ctx context.Context, tx pgx.Tx, taskID int64, token *int64, result json.RawMessage) (Task, error) {
	if err := e.checkJSON("result", result); err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	if token != nil {
		if err := checkHolder(t, *token); err != nil {
			return Task{}, errorf("complete", taskID, err)
		}
	}
	if t.Status == fsm.Completing {
		// Only an operator's Transition gets here: the task already holds
		// its result and completes when its last foreground child settles.
		return Task{}, errorf("complete", taskID, transitionError(taskID, t.Status, fsm.Complete))
	}
	live, err := e.store.HasLiveForegroundChildren(ctx, tx, t.ID)
	if err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	if live {
		to, err := fsm.Transition(t.Status, fsm.Hold)
		if err != nil {
			return Task{}, errorf("complete", taskID, transitionError(taskID, t.Status, fsm.Hold))
		}
		held, err := e.store.HoldTask(ctx, tx, t.ID, to, result)
		if err != nil {
			return Task{}, errorf("complete", taskID, mapDBError(err))
		}
		return held, nil
	}
	done, err := e.settle(ctx, tx, t, fsm.Complete, result, nil)
	if err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	return done, nil
}
