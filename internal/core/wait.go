package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
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
	// Task is the task after the wait: waiting, or pending when Woken.
	Task Task
	// Woken is true when the wait was already satisfied when called: the
	// task parked and was woken in the same transaction (running → waiting
	// → pending), so it runs again from the wait's phase and state, as it
	// would have had a child settled a moment later. Either way the run
	// that called the wait is over.
	Woken bool
}

// WaitForChildren parks the running task held with token on its children
// until they satisfy the policy (docs/design.md §3.4), saving phase and
// state. The run ends in every case: the task is waiting, or — when the
// wait is satisfied already — woken at once (pending). A handler therefore
// returns after a wait whatever the children did, and never sees a wait
// "go on" in the same run: the re-entry with the wait's phase is the one
// place where it reads the outcomes. This is what makes "wait, then
// return" correct under every interleaving of the children's settles.
//
// The task's row is locked (after its conversation's) while the children
// are read and the task is written, and a child settling takes the same
// locks, so a wake-up is never lost. Under FailFast, a waited child that
// already settled other than completed satisfies the wait and aborts the
// other live waited children (bottom-up) in this same transaction.
func (e *Engine) WaitForChildren(ctx context.Context, tx pgx.Tx, taskID, token int64, p WaitParams) (WaitResult, error) {
	if !p.Policy.Valid() {
		return WaitResult{}, errorf("wait", taskID, fmt.Errorf("policy %q: %w", p.Policy, arbortype.ErrInvalidArgument))
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
		return WaitResult{}, errorf("wait", taskID, fmt.Errorf("%d children, over the limit of 10000: %w", len(ids), arbortype.ErrInvalidArgument))
	}

	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	children, err := e.Store.GetTasks(ctx, tx, ids)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	for i, id := range ids {
		if i >= len(children) || children[i].ID != id || children[i].OwnerID != taskID {
			return WaitResult{}, errorf("wait", taskID, fmt.Errorf("task %d: %w", id, arbortype.ErrNotChild))
		}
	}

	out := evaluateWait(p.Policy, children)
	if out.failFastBy != 0 && len(out.live) > 0 {
		if _, err := e.abortSubtrees(ctx, tx, t.ConversationID, out.live); err != nil {
			return WaitResult{}, errorf("wait", taskID, err)
		}
	}
	to, err := fsm.Transition(t.Status, fsm.Wait)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, transitionError(taskID, t.Status, fsm.Wait))
	}
	parked, err := e.Store.WaitTask(ctx, tx, t.ConversationID, taskID, to, p.Phase, p.State, p.Policy, ids)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, mapDBError(err))
	}
	if !out.satisfied {
		return WaitResult{Task: parked}, nil
	}
	woken, err := e.wakeLocked(ctx, tx, parked)
	if err != nil {
		return WaitResult{}, errorf("wait", taskID, err)
	}
	return WaitResult{Task: woken, Woken: true}, nil
}
