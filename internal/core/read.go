package core

import (
	"context"
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/store"
)

// Reads. Each runs one statement on db (the pool, or the caller's
// transaction) and takes no lock.

// Get reads one task. ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, db store.DB, taskID int64) (Task, error) {
	t, err := e.Store.GetTask(ctx, db, taskID)
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
func (e *Engine) GetMany(ctx context.Context, db store.DB, taskIDs []int64) ([]Task, error) {
	if len(taskIDs) > 100_000 {
		return nil, fmt.Errorf("get tasks: %d ids, over the limit of 100000: %w", len(taskIDs), ErrInvalidArgument)
	}
	ts, err := e.Store.GetTasks(ctx, db, taskIDs)
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

// Children reads every child of a task (foreground and background, live
// and settled) in ascending id order. ErrNotFound when the task does not
// exist.
func (e *Engine) Children(ctx context.Context, db store.DB, taskID int64) ([]Task, error) {
	t, err := e.Get(ctx, db, taskID)
	if err != nil {
		return nil, err
	}
	kids, err := e.Store.Children(ctx, db, t.ConversationID, taskID)
	if err != nil {
		return nil, errorf("read the children of", taskID, err)
	}
	return kids, nil
}

// ConversationTasks reads every task of a conversation in ascending id
// order (ancestors first). ErrNotFound when the conversation does not exist.
func (e *Engine) ConversationTasks(ctx context.Context, db store.DB, conversationID string) ([]Task, error) {
	if err := checkText("conversation id", conversationID, true); err != nil {
		return nil, fmt.Errorf("read conversation: %w", err)
	}
	ts, err := e.Store.ConversationTasks(ctx, db, conversationID)
	if err != nil {
		return nil, fmt.Errorf("read the tasks of conversation %q: %w", conversationID, err)
	}
	if len(ts) == 0 {
		if _, err := e.Conversation(ctx, db, conversationID); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// Conversation reads one conversation. ErrNotFound when there is none.
func (e *Engine) Conversation(ctx context.Context, db store.DB, conversationID string) (arbortype.Conversation, error) {
	if err := checkText("conversation id", conversationID, true); err != nil {
		return arbortype.Conversation{}, fmt.Errorf("read conversation: %w", err)
	}
	c, err := e.Store.GetConversation(ctx, db, conversationID)
	if store.IsNoRows(err) {
		return arbortype.Conversation{}, fmt.Errorf("read conversation %q: %w", conversationID, ErrNotFound)
	}
	if err != nil {
		return arbortype.Conversation{}, fmt.Errorf("read conversation %q: %w", conversationID, err)
	}
	return c, nil
}

// ListParams select the conversations ListConversations returns.
type ListParams struct {
	// Statuses, when not empty, keeps the conversations with a live task in
	// one of these (live) statuses.
	Statuses []arbortype.Status
	// Limit is the most conversations to return; 0 means no limit.
	Limit int
}

// ListConversations lists the conversations that have live tasks, in id
// order, with their lease and their live tasks counted by status.
func (e *Engine) ListConversations(ctx context.Context, db store.DB, p ListParams) ([]arbortype.ConversationSummary, error) {
	for _, st := range p.Statuses {
		if !st.Live() {
			return nil, fmt.Errorf("list conversations: status %q is not a live status: %w", st, ErrInvalidArgument)
		}
	}
	if p.Limit < 0 {
		return nil, fmt.Errorf("list conversations: limit %d is negative: %w", p.Limit, ErrInvalidArgument)
	}
	out, err := e.Store.LiveConversations(ctx, db, p.Statuses, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list conversations: %w", err)
	}
	return out, nil
}

// RecentConversations lists up to limit (1..1000) conversations that had a
// task created lately, the most recent first.
func (e *Engine) RecentConversations(ctx context.Context, db store.DB, limit int) ([]arbortype.Conversation, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("recent conversations: limit %d is outside 1..1000: %w", limit, ErrInvalidArgument)
	}
	out, err := e.Store.RecentConversations(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("recent conversations: %w", err)
	}
	return out, nil
}
