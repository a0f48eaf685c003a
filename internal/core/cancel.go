package core

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Cancel is a user's cancel of a pending, running, waiting or sleeping
// task: its live foreground children are aborted first, then it settles
// cancelled with result, then its owner is reconciled.
func (e *Engine) Cancel(ctx context.Context, tx pgx.Tx, taskID int64, result json.RawMessage) (Task, error) {
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
