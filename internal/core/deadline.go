package core

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Expire fails taskID if it is live past its deadline (by the database's
// clock): its live foreground subtree is aborted first, leaves first, then
// the task fails with code deadline_exceeded, whatever it was doing, and its
// owner is reconciled. A task settled meanwhile, or not yet due, is left
// alone (expired false).
func (e *Engine) Expire(ctx context.Context, tx pgx.Tx, taskID int64) (expired bool, err error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return false, errorf("expire", taskID, err)
	}
	if t.Status.Settled() || t.Deadline == nil {
		return false, nil
	}
	due, _, err := e.Store.DueNow(ctx, tx, *t.Deadline)
	if err != nil || !due {
		return false, err
	}
	te := &TaskError{Code: arbortype.CodeDeadlineExceeded, NonRetryable: true,
		Message: fmt.Sprintf("still %s past its deadline %s", t.Status, t.Deadline.UTC().Format(time.RFC3339Nano))}
	if err := e.expireLocked(ctx, tx, t, te); err != nil {
		return false, errorf("expire", taskID, err)
	}
	return true, nil
}

// expireLocked fails the live task t, locked with its conversation,
// whatever it is doing, with te: its live foreground subtree is aborted
// first, leaves first, its wake jobs dropped, and its owner reconciled.
func (e *Engine) expireLocked(ctx context.Context, tx pgx.Tx, t Task, te *TaskError) error {
	to, err := fsm.Transition(t.Status, fsm.Expire)
	if err != nil {
		return transitionError(t.ID, t.Status, fsm.Expire)
	}
	if err := e.abortForegroundChildren(ctx, tx, t); err != nil {
		return err
	}
	if err := e.dropWakeJobs(ctx, tx, t); err != nil {
		return err
	}
	settled, err := e.Store.SettleFailedTask(ctx, tx, t.ConversationID, t.ID, to, te, e.Cfg.ErrorHistoryLimit)
	if err != nil {
		return mapDBError(err)
	}
	return e.reconcileOwner(ctx, tx, settled)
}

// LiveDeadlines lists up to limit live tasks past their deadline.
func (e *Engine) LiveDeadlines(ctx context.Context, db store.DB, limit int) ([]int64, error) {
	ids, err := e.Store.LiveDeadlines(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("tasks past their deadline: %w", err)
	}
	return ids, nil
}
