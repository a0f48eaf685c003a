package core

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Fail ends the run holding *token with a failure (see machine.Run); a nil
// token is recovery's or the runner's forced failure (no token check, no
// retry).
func (e *Engine) Fail(ctx context.Context, tx pgx.Tx, taskID int64, token *int64, taskErr TaskError) (Task, error) {
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
	if err := e.abortForegroundChildren(ctx, tx, t); err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	failed, err := e.settleFailed(ctx, tx, t, recorded)
	if err != nil {
		return Task{}, errorf("fail", taskID, err)
	}
	return failed, nil
}
