package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
)

// WaitParams describe a wait for children.
type WaitParams struct {
	// ChildIDs are the children to wait on: each must be the task's own
	// child (foreground or background). Duplicates count once. An empty list
	// is a wait that is satisfied at once.
	ChildIDs []int64
	// Policy is AllSettled or FailFast. Required.
	Policy WaitPolicy
	// Phase and State are saved with the wait, as by a checkpoint: the
	// handler resumes from them when the task is woken.
	Phase string
	State json.RawMessage
}

// WaitResult says how a wait ended.
type WaitResult struct {
	Task Task
	// Satisfied is true when the wait was already satisfied when called:
	// the task did not park, stays running with the same token, and its
	// phase and state were saved as by a checkpoint. When false the task is
	// waiting, and is woken (pending) when the wait is satisfied.
	Satisfied bool
}

// WaitForChildren parks the running task held with token until its children
// satisfy the policy (DESIGN §3.4), saving phase and state. The task's row
// is locked (after its conversation's) while the children are read and the
// task is written, and a child settling takes the same locks, so a wake-up
// is never lost: either the child settled first and this call sees it, or
// the child's settle sees the task waiting and wakes it.
//
// Under FailFast, a waited child that already settled other than completed
// satisfies the wait at once and aborts the other live waited children
// (bottom-up) in this same transaction.
//
// Fenced like Checkpoint. A child that is not the task's own (or the task
// itself) is ErrNotChild; nothing is written.
func (e *Engine) WaitForChildren(ctx context.Context, taskID, token int64, p WaitParams) (res WaitResult, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		res, err = e.wait(ctx, tx, taskID, token, p)
		return err
	})
	return res, err
}

// WaitForChildrenTx is WaitForChildren inside the caller's transaction.
func (e *Engine) WaitForChildrenTx(ctx context.Context, tx pgx.Tx, taskID, token int64, p WaitParams) (res WaitResult, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		res, err = e.wait(ctx, tx, taskID, token, p)
		return err
	})
	return res, err
}

func (e *Engine) wait(ctx context.Context, tx pgx.Tx, taskID, token int64, p WaitParams) (WaitResult, error) {
	if p.Policy != AllSettled && p.Policy != FailFast {
		return WaitResult{}, errorf("wait", taskID, fmt.Errorf("policy %q: %w", p.Policy, ErrInvalidArgument))
	}
	if err := checkText("phase", p.Phase, false); err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	if err := e.checkJSON("state", p.State); err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	ids := slices.Clone(p.ChildIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > 10_000 {
		return WaitResult{}, errorf("wait", taskID, fmt.Errorf("%d children, over the limit of 10000: %w", len(ids), ErrInvalidArgument))
	}

	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	children, err := e.store.GetTasks(ctx, tx, ids)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	for i, id := range ids {
		if i >= len(children) || children[i].ID != id || children[i].OwnerID != taskID {
			return WaitResult{}, errorf("wait", taskID, fmt.Errorf("task %d: %w", id, ErrNotChild))
		}
	}

	out := evaluateWait(p.Policy, children)
	if out.satisfied {
		if out.failFastBy != 0 && len(out.live) > 0 {
			if _, err := e.abortSubtrees(ctx, tx, out.live); err != nil {
				return WaitResult{}, errorf("wait", taskID, err)
			}
		}
		saved, err := e.store.CheckpointTask(ctx, tx, taskID, token, p.Phase, p.State, e.cfg.LeaseDuration)
		if err != nil {
			return WaitResult{}, errorf("wait", taskID, mapDBError(err))
		}
		return WaitResult{Task: saved, Satisfied: true}, nil
	}
	to, err := fsm.Transition(t.Status, fsm.Wait)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, transitionError(taskID, t.Status, fsm.Wait))
	}
	parked, err := e.store.WaitTask(ctx, tx, taskID, to, p.Phase, p.State, p.Policy, ids)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, mapDBError(err))
	}
	return WaitResult{Task: parked}, nil
}
