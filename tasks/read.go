package tasks

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// Reads take no lock and run one statement (Children and ConversationTasks
// a second one to tell an unknown id from an empty list). The …Tx forms read
// inside the caller's transaction, so they see its own uncommitted writes.

// Get reads one task. arbortype.ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, taskID int64) (arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.Task, error) { return e.core.Get(ctx, db, taskID) })
}

// GetTx is Get inside the caller's transaction.
func (e *Engine) GetTx(ctx context.Context, tx pgx.Tx, taskID int64) (arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) (arbortype.Task, error) { return e.core.Get(ctx, db, taskID) })
}

// GetMany reads the tasks with the given ids in ascending id order. An id
// that does not exist is arbortype.ErrNotFound, naming it.
func (e *Engine) GetMany(ctx context.Context, taskIDs []int64) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.GetMany(ctx, db, taskIDs) })
}

// GetManyTx is GetMany inside the caller's transaction.
func (e *Engine) GetManyTx(ctx context.Context, tx pgx.Tx, taskIDs []int64) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.GetMany(ctx, db, taskIDs) })
}

// Children reads every child of a task (foreground and background, live and
// settled) in ascending id order. arbortype.ErrNotFound when the task does not exist.
func (e *Engine) Children(ctx context.Context, taskID int64) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.Children(ctx, db, taskID) })
}

// ChildrenTx is Children inside the caller's transaction.
func (e *Engine) ChildrenTx(ctx context.Context, tx pgx.Tx, taskID int64) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.Children(ctx, db, taskID) })
}

// ConversationTasks reads every task of a conversation in ascending id
// order, which is ancestors first. arbortype.ErrNotFound when the conversation does
// not exist.
func (e *Engine) ConversationTasks(ctx context.Context, conversationID string) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.ConversationTasks(ctx, db, conversationID) })
}

// ConversationTasksTx is ConversationTasks inside the caller's transaction.
func (e *Engine) ConversationTasksTx(ctx context.Context, tx pgx.Tx, conversationID string) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.ConversationTasks(ctx, db, conversationID) })
}

// Conversation reads one conversation: its lease holder, epoch and lease
// deadline. arbortype.ErrNotFound when there is none.
func (e *Engine) Conversation(ctx context.Context, conversationID string) (arbortype.Conversation, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.Conversation, error) { return e.core.Conversation(ctx, db, conversationID) })
}

// ConversationTx is Conversation inside the caller's transaction.
func (e *Engine) ConversationTx(ctx context.Context, tx pgx.Tx, conversationID string) (arbortype.Conversation, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) (arbortype.Conversation, error) { return e.core.Conversation(ctx, db, conversationID) })
}

// ListParams select the conversations ListConversations returns.
type ListParams struct {
	// Statuses, when not empty, keeps the conversations with a live task in
	// one of these live statuses (their counts still cover every status).
	Statuses []arbortype.Status
	// Limit is the most conversations to return; 0 means no limit.
	Limit int
}

// ListConversations lists the conversations that have live tasks, in id
// order, each with its lease and its live tasks counted by status. It has
// no …Tx form: it spans conversations, for operators (arbor ls), and is
// never part of an application's transaction.
func (e *Engine) ListConversations(ctx context.Context, p ListParams) ([]arbortype.ConversationSummary, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.ConversationSummary, error) {
		return e.core.ListConversations(ctx, db, core.ListParams(p))
	})
}

// RecentConversations lists up to limit (1..1000) conversations that had a
// task created lately, live or settled, the most recent first: those of the
// newest 1,000 tasks. Like ListConversations it is for operators (the web
// view's front page) and has no …Tx form.
func (e *Engine) RecentConversations(ctx context.Context, limit int) ([]arbortype.Conversation, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Conversation, error) {
		return e.core.RecentConversations(ctx, db, limit)
	})
}
