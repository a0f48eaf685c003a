package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Reads. Each runs one statement on db (the pool, or the caller's
// transaction) and takes no lock.

// Get reads one task. ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, db store.DB, taskID int64) (Task, error) {
	t, err := e.Store.GetTask(ctx, db, taskID)
	if store.IsNoRows(err) {
		return Task{}, errorf("get", taskID, arbortype.ErrNotFound)
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
		return nil, fmt.Errorf("get tasks: %d ids, over the limit of 100000: %w", len(taskIDs), arbortype.ErrInvalidArgument)
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
			return nil, errorf("get", id, arbortype.ErrNotFound)
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
		return arbortype.Conversation{}, fmt.Errorf("read conversation %q: %w", conversationID, arbortype.ErrNotFound)
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
			return nil, fmt.Errorf("list conversations: status %q is not a live status: %w", st, arbortype.ErrInvalidArgument)
		}
	}
	if p.Limit < 0 {
		return nil, fmt.Errorf("list conversations: limit %d is negative: %w", p.Limit, arbortype.ErrInvalidArgument)
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
		return nil, fmt.Errorf("recent conversations: limit %d is outside 1..1000: %w", limit, arbortype.ErrInvalidArgument)
	}
	out, err := e.Store.RecentConversations(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("recent conversations: %w", err)
	}
	return out, nil
}

// The web view's reads (package arborui, through tasks): each reads at
// most a bounded number of rows, and pages by keyset.

// checkBound refuses a limit outside 1..most.
func checkBound(op, name string, n, most int) error {
	if n < 1 || n > most {
		return fmt.Errorf("%s: %s %d is outside 1..%d: %w", op, name, n, most, arbortype.ErrInvalidArgument)
	}
	return nil
}

// Bounds of the web view's reads.
const (
	// MaxPage is the most rows a page of a listing returns.
	MaxPage = 5000
	// MaxScan is the most rows a listing's page reads to find them.
	MaxScan = 100_000
	// MaxCut is the most characters of a payload a listing returns.
	MaxCut = 1 << 20
)

func checkLiveStatuses(op string, statuses []string) error {
	for _, st := range statuses {
		if !arbortype.Status(st).Live() {
			return fmt.Errorf("%s: status %q is not a live status: %w", op, st, arbortype.ErrInvalidArgument)
		}
	}
	return nil
}

// ConversationsByID lists up to limit conversations f keeps among the
// next scan after id after, in id order.
func (e *Engine) ConversationsByID(ctx context.Context, db store.DB, f store.ConversationFilter, after string, limit, scan int) (store.ConversationScan, error) {
	const op = "list conversations"
	if err := errors.Join(checkBound(op, "limit", limit, MaxPage), checkBound(op, "scan", scan, MaxScan), checkLiveStatuses(op, f.Statuses)); err != nil {
		return store.ConversationScan{}, err
	}
	out, err := e.Store.ConversationsByID(ctx, db, f, after, limit, scan)
	if err != nil {
		return out, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// ConversationsByRecent lists up to limit conversations f keeps among
// those of the next scan tasks below task id before, the newest first.
func (e *Engine) ConversationsByRecent(ctx context.Context, db store.DB, f store.ConversationFilter, before int64, limit, scan int) (store.ConversationScan, error) {
	const op = "list conversations"
	if err := errors.Join(checkBound(op, "limit", limit, MaxPage), checkBound(op, "scan", scan, MaxScan), checkLiveStatuses(op, f.Statuses)); err != nil {
		return store.ConversationScan{}, err
	}
	out, err := e.Store.ConversationsByRecent(ctx, db, f, before, limit, scan)
	if err != nil {
		return out, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// LiveCounts counts the live tasks by status, and those awaiting an event
// (status "awaiting"), reading at most limit rows of each.
func (e *Engine) LiveCounts(ctx context.Context, db store.DB, limit int) ([]store.LiveCount, error) {
	if err := checkBound("count live tasks", "limit", limit, 10*MaxScan); err != nil {
		return nil, err
	}
	out, err := e.Store.LiveCounts(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("count live tasks: %w", err)
	}
	return out, nil
}

// AwaitsAfter lists up to limit tasks awaiting an event after the key
// (conversation, await name, task id): across conversations, or only
// within conv when only is set.
func (e *Engine) AwaitsAfter(ctx context.Context, db store.DB, only bool, conv, name string, id int64, limit int) ([]store.TaskSummary, error) {
	if err := checkBound("list awaits", "limit", limit, MaxPage); err != nil {
		return nil, err
	}
	var (
		out []store.TaskSummary
		err error
	)
	if only {
		out, err = e.Store.ConversationAwaitsAfter(ctx, db, conv, name, id, limit)
	} else {
		out, err = e.Store.AwaitsAfter(ctx, db, conv, name, id, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("list awaits: %w", err)
	}
	return out, nil
}

// TreePage reads up to limit tasks of a conversation after task id after,
// in id order (those in statuses, when given), with the children of each
// counted, and the conversation's tasks counted by status (at most
// countLimit read). ErrNotFound when the conversation does not exist.
func (e *Engine) TreePage(ctx context.Context, db store.DB, conv string, after int64, statuses []string, limit, countLimit int) (
	page []store.TaskSummary, children map[int64]int, counts map[arbortype.Status]int, err error) {
	op := fmt.Sprintf("read the tree of conversation %q", conv)
	if err := errors.Join(checkText("conversation id", conv, true), checkBound(op, "limit", limit, MaxPage),
		checkBound(op, "count limit", countLimit, 100*MaxScan)); err != nil {
		return nil, nil, nil, err
	}
	for _, st := range statuses {
		if !arbortype.Status(st).Valid() {
			return nil, nil, nil, fmt.Errorf("%s: no status %q: %w", op, st, arbortype.ErrInvalidArgument)
		}
	}
	if page, err = e.Store.TreePage(ctx, db, conv, after, statuses, limit); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	if len(page) == 0 && after == 0 {
		if _, err := e.Conversation(ctx, db, conv); err != nil {
			return nil, nil, nil, err
		}
	}
	ids := make([]int64, len(page))
	for i, t := range page {
		ids[i] = t.ID
	}
	if children, err = e.Store.ChildCounts(ctx, db, conv, ids); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	if counts, err = e.Store.StatusCounts(ctx, db, conv, countLimit); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	return page, children, counts, nil
}

// ChildrenPage reads up to limit children of taskID after task id after,
// in id order, and counts them all. ErrNotFound when the task does not
// exist.
func (e *Engine) ChildrenPage(ctx context.Context, db store.DB, taskID, after int64, limit int) ([]store.TaskSummary, int, error) {
	if err := checkBound("read the children", "limit", limit, MaxPage); err != nil {
		return nil, 0, err
	}
	conv, err := e.Store.TaskConversation(ctx, db, taskID)
	if store.IsNoRows(err) {
		return nil, 0, errorf("read the children of", taskID, arbortype.ErrNotFound)
	}
	if err != nil {
		return nil, 0, errorf("read the children of", taskID, err)
	}
	page, err := e.Store.ChildrenPage(ctx, db, conv, taskID, after, limit)
	if err != nil {
		return nil, 0, errorf("read the children of", taskID, err)
	}
	n, err := e.Store.ChildCounts(ctx, db, conv, []int64{taskID})
	if err != nil {
		return nil, 0, errorf("read the children of", taskID, err)
	}
	return page, n[taskID], nil
}

// LogPage reads a conversation's log (only taskID's entries when it is
// not 0), payloads cut to cut characters: with after > 0, up to limit
// entries after it, in order; otherwise up to limit below seq before (0:
// from the newest), the newest first — for a task, among the scan
// entries below it, and low is the lowest seq of those read (where the
// next page of the task's starts). ErrNotFound when the conversation
// does not exist.
func (e *Engine) LogPage(ctx context.Context, db store.DB, conv string, taskID, after, before int64, limit, scan, cut int) (
	rows []store.LogRow, scanned int, low int64, err error) {
	op := fmt.Sprintf("read the log of conversation %q", conv)
	if err := errors.Join(checkText("conversation id", conv, true), checkBound(op, "limit", limit, MaxPage),
		checkBound(op, "scan", scan, MaxScan), checkBound(op, "cut", cut, MaxCut)); err != nil {
		return nil, 0, 0, err
	}
	if before <= 0 {
		before = math.MaxInt64
	}
	switch {
	case after > 0:
		rows, err = e.Store.LogAfter(ctx, db, conv, after, limit, cut)
		if err == nil && taskID != 0 {
			rows = slices.DeleteFunc(rows, func(r store.LogRow) bool { return r.TaskID != taskID })
		}
	case taskID != 0:
		if rows, err = e.Store.TaskLogBefore(ctx, db, conv, taskID, before, limit, scan, cut); err == nil {
			scanned, low, err = e.Store.LogWindow(ctx, db, conv, before, scan)
		}
	default:
		rows, err = e.Store.LogBefore(ctx, db, conv, before, limit, cut)
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s: %w", op, err)
	}
	if len(rows) == 0 && after == 0 && before == math.MaxInt64 {
		if _, err := e.Conversation(ctx, db, conv); err != nil {
			return nil, 0, 0, err
		}
	}
	return rows, scanned, low, nil
}

// LastLogSeq is the seq of the newest entry of any conversation's log.
func (e *Engine) LastLogSeq(ctx context.Context, db store.DB) (int64, error) {
	seq, err := e.Store.LastLogSeq(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("read the log's head: %w", err)
	}
	return seq, nil
}

// TaskEvents reads up to limit events addressed or delivered to taskID,
// the newest first, payloads cut to cut characters. ErrNotFound when the
// task does not exist.
func (e *Engine) TaskEvents(ctx context.Context, db store.DB, taskID int64, limit, cut int) ([]store.EventRow, error) {
	if err := errors.Join(checkBound("read the events", "limit", limit, MaxPage), checkBound("read the events", "cut", cut, MaxCut)); err != nil {
		return nil, err
	}
	conv, err := e.Store.TaskConversation(ctx, db, taskID)
	if store.IsNoRows(err) {
		return nil, errorf("read the events of", taskID, arbortype.ErrNotFound)
	}
	if err != nil {
		return nil, errorf("read the events of", taskID, err)
	}
	out, err := e.Store.TaskEvents(ctx, db, conv, taskID, limit, cut)
	if err != nil {
		return nil, errorf("read the events of", taskID, err)
	}
	return out, nil
}

// TaskBudgets reads the budgets taskID's spend counts against and what it
// spent and holds itself. ErrNotFound when the task does not exist.
func (e *Engine) TaskBudgets(ctx context.Context, db store.DB, taskID int64) ([]arbortype.Budget, []store.TaskSpend, error) {
	conv, err := e.Store.TaskConversation(ctx, db, taskID)
	if store.IsNoRows(err) {
		return nil, nil, errorf("read the budgets of", taskID, arbortype.ErrNotFound)
	}
	if err != nil {
		return nil, nil, errorf("read the budgets of", taskID, err)
	}
	rows, spend, err := e.Store.TaskBudgets(ctx, db, conv, taskID)
	if err != nil {
		return nil, nil, errorf("read the budgets of", taskID, err)
	}
	out := make([]arbortype.Budget, len(rows))
	for i, b := range rows {
		out[i] = budget(b)
	}
	return out, spend, nil
}

// Holders reads up to limit holder rows, with the conversations each
// holds counted up to held.
func (e *Engine) Holders(ctx context.Context, db store.DB, limit, held int) ([]store.HolderRow, error) {
	if err := errors.Join(checkBound("read the holders", "limit", limit, MaxPage), checkBound("read the holders", "held", held, 10*MaxScan)); err != nil {
		return nil, err
	}
	out, err := e.Store.Holders(ctx, db, limit, held)
	if err != nil {
		return nil, fmt.Errorf("read the holders: %w", err)
	}
	return out, nil
}

// RecentRestarts reads up to limit tasks with attempt > 0 among the scan
// newest tasks, the newest first.
func (e *Engine) RecentRestarts(ctx context.Context, db store.DB, scan, limit int) ([]store.TaskSummary, error) {
	const op = "read the recent restarts"
	if err := errors.Join(checkBound(op, "scan", scan, MaxScan), checkBound(op, "limit", limit, MaxPage)); err != nil {
		return nil, err
	}
	out, err := e.Store.RecentRestarts(ctx, db, scan, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
