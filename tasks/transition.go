package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// Transition applies event to a task without a runner's token, as an
// operator would: it locks the task's conversation row and then the task's,
// checks the edge with package fsm and returns
// ErrNotFound or a *TransitionError when there is none. Events with
// consequences go through the same code as the operations that own them, so
// the tree stays consistent:
//
//   - start is Start; wake ends a wait or a sleep at once; recover puts a
//     running task back to pending with attempt + 1;
//   - complete, fail and cancel are Complete, Fail and Cancel without the
//     token check (fail also settles a pending task, as recovery does past
//     the restart limit);
//   - abort and orphan are Abort; orphan only for a pending task that never
//     ran, abort for any other live task.
//
// checkpoint, wait, sleep, retry and hold carry data and have operations of
// their own: Transition refuses them with ErrInvalidArgument once the edge
// itself is known to be valid.
func (e *Engine) Transition(ctx context.Context, taskID int64, event fsm.Event) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.transition(ctx, tx, taskID, event)
		return err
	})
	return task, err
}

// TransitionTx is Transition inside the caller's transaction.
func (e *Engine) TransitionTx(ctx context.Context, tx pgx.Tx, taskID int64, event fsm.Event) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.transition(ctx, tx, taskID, event)
		return err
	})
	return task, err
}

func (e *Engine) transition(ctx context.Context, tx pgx.Tx, taskID int64, event fsm.Event) (Task, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("transition", taskID, err)
	}
	to, err := fsm.Transition(t.Status, event)
	if err != nil {
		return Task{}, errorf("transition", taskID, transitionError(taskID, t.Status, event))
	}
	switch event {
	case fsm.Start:
		return e.start(ctx, tx, taskID)
	case fsm.Wake:
		woken, err := e.wakeLocked(ctx, tx, t)
		if err != nil {
			return Task{}, errorf("wake", taskID, err)
		}
		return woken, nil
	case fsm.Recover:
		recovered, err := e.store.RecoverTask(ctx, tx, taskID, to)
		if err != nil {
			return Task{}, errorf("recover", taskID, mapDBError(err))
		}
		return recovered, nil
	case fsm.Complete:
		return e.complete(ctx, tx, taskID, nil, nil)
	case fsm.Fail:
		return e.fail(ctx, tx, taskID, nil, TaskError{Code: "failed_by_operator", Message: "failed by an operator's transition"})
	case fsm.Cancel:
		return e.cancel(ctx, tx, taskID, nil)
	case fsm.Abort, fsm.Orphan:
		neverRan := t.Status == fsm.Pending && t.StartedAt == nil
		if (event == fsm.Orphan) != neverRan {
			return Task{}, errorf("transition", taskID, fmt.Errorf("%w: %s is for a task that %s",
				ErrInvalidTransition, event, map[bool]string{true: "never ran", false: "has run"}[event == fsm.Orphan]))
		}
		if _, err := e.abort(ctx, tx, taskID); err != nil {
			return Task{}, err
		}
		return e.store.GetTask(ctx, tx, taskID)
	}
	return Task{}, errorf("transition", taskID, fmt.Errorf("%w: event %q carries data; use its own operation", ErrInvalidArgument, event))
}
