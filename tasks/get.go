package tasks

import (
	"context"
	"fmt"

	"github.com/arborhq/arbor/store"
)

// Get reads one task. ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, taskID int64) (Task, error) {
	return e.GetTx(ctx, e.pool, taskID)
}

// GetTx is Get on the caller's transaction (or any store.DB).
func (e *Engine) GetTx(ctx context.Context, db store.DB, taskID int64) (Task, error) {
	t, err := e.store.GetTask(ctx, db, taskID)
	if store.IsNoRows(err) {
		return Task{}, errorf("get", taskID, ErrNotFound)
	}
	if err != nil {
		return Task{}, errorf("get", taskID, err)
	}
	return t, nil
}

// GetMany reads the tasks with the given ids in ascending id order. An id
// that does not exist is ErrNotFound, naming it.
func (e *Engine) GetMany(ctx context.Context, taskIDs []int64) ([]Task, error) {
	ts, err := e.store.GetTasks(ctx, e.pool, taskIDs)
	if err != nil {
		return nil, fmt.Errorf("get tasks: %w", err)
	}
	found := make(map[int64]bool, len(ts))
	for _, t := range ts {
		found[t.ID] = true
	}
	for _, id := range taskIDs {
		if !found[id] {
			return nil, errorf("get", id, ErrNotFound)
		}
	}
	return ts, nil
}

// LiveChildren reads the live children of a task (foreground and
// background) in ascending id order. ErrNotFound when the task does not exist.
func (e *Engine) LiveChildren(ctx context.Context, taskID int64) ([]Task, error) {
	if _, err := e.Get(ctx, taskID); err != nil {
		return nil, err
	}
	return e.store.LiveChildren(ctx, e.pool, taskID)
}

// Children reads every child of a task in ascending id order.
func (e *Engine) Children(ctx context.Context, taskID int64) ([]Task, error) {
	if _, err := e.Get(ctx, taskID); err != nil {
		return nil, err
	}
	return e.store.Children(ctx, e.pool, taskID)
}

// ConversationTasks reads every task of a conversation in ascending id order.
func (e *Engine) ConversationTasks(ctx context.Context, conversationID string) ([]Task, error) {
	return e.store.ConversationTasks(ctx, e.pool, conversationID)
}
