package core

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// OverWallTime lists up to limit live tasks under a "fail" wall-time
// budget that is over.
func (e *Engine) OverWallTime(ctx context.Context, db store.DB, limit int) ([]int64, error) {
	return e.Store.OverWallTime(ctx, db, limit)
}

// ExpireWallTime fails taskID, code budget_exhausted, if it is live under
// a "fail" wall-time budget that is over (its own, an owner's or its
// conversation's); its foreground subtree is aborted first, as a
// deadline's.
func (e *Engine) ExpireWallTime(ctx context.Context, tx pgx.Tx, taskID int64) (bool, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	if t.Status.Settled() {
		return false, nil
	}
	chain, err := e.Store.ScopeChain(ctx, tx, t.ConversationID, taskID)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	rows, err := e.Store.LockBudgets(ctx, tx, t.ConversationID, []string{arbortype.CounterWallTime})
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	over, _, err := e.overBudget(ctx, tx, t.ConversationID, chain, rows, nil, arbortype.CounterWallTime, 0)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	if over == nil || over.Budget.OnExhausted != arbortype.BudgetFail {
		return false, nil
	}
	te := &TaskError{Code: arbortype.CodeBudgetExhausted, NonRetryable: true, Message: over.Error()}
	if err := e.expireLocked(ctx, tx, t, te); err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	return true, nil
}
