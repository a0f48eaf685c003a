package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Rerun runs task taskID again from its last checkpoint (see
// tasks.Engine.Rerun, docs/design.md §3.17): a new task, rerun_of naming
// the source, which stays as it is. Locks: the conversation, the source,
// then its owner.
func (e *Engine) Rerun(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	if taskID <= 0 {
		return Task{}, errorf("rerun", taskID, fmt.Errorf("task id %d: %w", taskID, arbortype.ErrInvalidArgument))
	}
	src, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return Task{}, errorf("rerun", taskID, err)
	}
	switch src.Status {
	case arbortype.StatusFailed, arbortype.StatusAborted, arbortype.StatusCancelled:
	case arbortype.StatusCompleted, arbortype.StatusOrphaned:
		return Task{}, errorf("rerun", taskID, fmt.Errorf("%w: it is %s; only a failed, aborted or cancelled task is rerun", arbortype.ErrInvalidTransition, src.Status))
	default:
		return Task{}, errorf("rerun", taskID, fmt.Errorf("%w (it is %s)", arbortype.ErrNotSettled, src.Status))
	}
	switch rerun, err := e.Store.RerunOf(ctx, tx, src.ConversationID, taskID); {
	case err == nil:
		return Task{}, errorf("rerun", taskID, fmt.Errorf("%w: it was rerun already, as task %d (rerun that one)", arbortype.ErrInvalidTransition, rerun))
	case !store.IsNoRows(err):
		return Task{}, errorf("rerun", taskID, err)
	}
	var owner Task
	if src.OwnerID != 0 {
		if owner, err = e.Store.LockTask(ctx, tx, src.ConversationID, src.OwnerID); err != nil {
			return Task{}, errorf("rerun", taskID, fmt.Errorf("owner %d: %w", src.OwnerID, err))
		}
		if err := ownerCanSpawn(owner); err != nil {
			return Task{}, errorf("rerun", taskID, fmt.Errorf("%w; rerun the owner or the turn instead", err))
		}
	}
	budgets, err := e.Store.ConversationBudgets(ctx, tx, src.ConversationID)
	if err != nil {
		return Task{}, errorf("rerun", taskID, err)
	}
	var limits []arbortype.BudgetLimit
	for _, b := range budgets {
		if b.TaskID == src.ID {
			limits = append(limits, arbortype.BudgetLimit{Counter: b.Counter, Max: b.Max, OnExhausted: b.OnExhausted})
		}
	}
	t, err := e.Store.RerunTask(ctx, tx, src.ConversationID, src.ID)
	if err != nil {
		return Task{}, errorf("rerun", taskID, mapDBError(err))
	}
	if len(limits) > 0 {
		p := CreateParams{CreateParams: arbortype.CreateParams{ConversationID: t.ConversationID, Budgets: limits}}
		if err := e.ApplyCreateBudgets(ctx, tx, []CreateParams{p}, []Task{t}, []bool{true}); err != nil {
			return Task{}, errorf("rerun", taskID, mapDBError(err))
		}
	}
	if owner.Status == arbortype.StatusWaiting && slices.Contains(owner.WaitIDs, src.ID) {
		if _, err := e.Store.RerunInWait(ctx, tx, src.ConversationID, owner.ID, src.ID, t.ID); err != nil {
			return Task{}, errorf("rerun", taskID, mapDBError(err))
		}
	}
	return t, nil
}
