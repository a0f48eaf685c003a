package core

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Complete ends the run holding token with result (see machine.Run.Complete):
// completed, or completing while foreground children are live; the owner is
// reconciled in the same transaction.
func (e *Engine) Complete(ctx context.Context, tx pgx.Tx, taskID, token int64, result json.RawMessage) (Task, error) {
	if err := e.checkJSON("result", result); err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	live, err := e.Store.HasLiveForegroundChildren(ctx, tx, t.ConversationID, t.ID)
	if err != nil {
		return Task{}, errorf("complete", taskID, err)
	}
	if live {
		to, err := fsm.Transition(t.Status, fsm.Hold)
		if err != nil {
			return Task{}, errorf("complete", taskID, transitionError(taskID, t.Status, fsm.Hold))
		}
		held, err := e.Store.HoldTask(ctx, tx, t.ConversationID, t.ID, to, result)
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
