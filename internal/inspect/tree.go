package inspect

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// AwaitQuery pages the awaits across conversations, or of one
// (Engine.Awaits).
type AwaitQuery struct {
	// ConversationID, when not empty, lists only that conversation's.
	ConversationID string
	// Cursor is the Next of the page before; "" for the first page.
	Cursor string
	// Limit is the most awaits a page returns (1..5000). Default
	// PageLimitDefault (50).
	Limit int
}

// AwaitListing is a task parked in an await, as Engine.Awaits lists it:
// Task.AwaitName is the event it awaits, Task.AwaitToken the token that
// answers exactly this await (EmitToken), Task.WakeAt its timeout (nil
// for none) and Task.UpdatedAt when it parked.
type AwaitListing = TaskSummary

// AwaitPage is a page of Engine.Awaits.
type AwaitPage struct {
	Awaits []AwaitListing
	// Next is the cursor of the next page; "" when the listing is over.
	Next string
}

// Awaits lists what every conversation (or q.ConversationID) waits for
// from outside — its tasks parked in an await (an approval), each with
// its token — by conversation, event name and task, a page at a time
// along the awaiting index.
func (e *Reader) Awaits(ctx context.Context, q AwaitQuery) (AwaitPage, error) {
	if q.Limit == 0 {
		q.Limit = PageLimitDefault
	}
	var key struct {
		C string `json:"c"`
		N string `json:"n"`
		I int64  `json:"i"`
	}
	if q.Cursor != "" {
		if err := json.Unmarshal([]byte(q.Cursor), &key); err != nil {
			return AwaitPage{}, fmt.Errorf("list awaits: cursor %q: %w", q.Cursor, arbortype.ErrInvalidArgument)
		}
	}
	only := q.ConversationID != ""
	if only {
		key.C = q.ConversationID
	}
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.TaskSummary, error) {
		return e.core.AwaitsAfter(ctx, db, only, key.C, key.N, key.I, q.Limit)
	})
	if err != nil {
		return AwaitPage{}, err
	}
	out := AwaitPage{Awaits: summaries(rows)}
	if len(rows) == q.Limit {
		last := rows[len(rows)-1]
		key.C, key.N, key.I = last.ConversationID, last.AwaitName, last.ID
		next, _ := json.Marshal(key)
		out.Next = string(next)
	}
	return out, nil
}

// TreeQuery pages a conversation's tasks (Engine.Tree).
type TreeQuery struct {
	ConversationID string
	// After is the Next of the page before; 0 for the first page.
	After int64
	// Statuses keeps the tasks in these statuses; empty keeps all.
	Statuses []arbortype.Status
	// Limit is the most tasks a page returns (1..5000). Default 500.
	Limit int
	// CountLimit bounds how many tasks the counts by status read
	// (1..10,000,000). Default 1,000,000.
	CountLimit int
}

// Defaults of TreeQuery.
const (
	TreeLimitDefault      = 500
	TreeCountLimitDefault = 1_000_000
)

// TreePage is a page of a conversation's tasks.
type TreePage struct {
	// Tasks are in id order: ancestors first.
	Tasks []TaskSummary
	// Children counts the children of each task of the page (those with
	// none are absent), so that a drawing can say how many it leaves out.
	Children map[int64]int
	// Counts are all the conversation's tasks by status; CountsCapped
	// says they reached CountLimit.
	Counts       map[arbortype.Status]int
	CountsCapped bool
	// Next is the After of the next page; 0 when there is none.
	Next int64
}

// Tree reads a page of a conversation's tasks in id order (ancestors
// first), with their children counted and the conversation's tasks
// counted by status: a drawing of a 100,000-task tree reads a page of it,
// not all of it. arbortype.ErrNotFound when the conversation does not exist.
func (e *Reader) Tree(ctx context.Context, q TreeQuery) (TreePage, error) {
	if q.Limit == 0 {
		q.Limit = TreeLimitDefault
	}
	if q.CountLimit == 0 {
		q.CountLimit = TreeCountLimitDefault
	}
	statuses := make([]string, len(q.Statuses))
	for i, st := range q.Statuses {
		statuses[i] = string(st)
	}
	type result struct {
		page     []store.TaskSummary
		children map[int64]int
		counts   map[arbortype.Status]int
	}
	r, err := core.Read(ctx, e.core, func(db store.DB) (result, error) {
		p, ch, n, err := e.core.TreePage(ctx, db, q.ConversationID, q.After, statuses, q.Limit, q.CountLimit)
		return result{p, ch, n}, err
	})
	if err != nil {
		return TreePage{}, err
	}
	out := TreePage{Tasks: summaries(r.page), Children: r.children, Counts: r.counts}
	total := 0
	for _, n := range r.counts {
		total += n
	}
	out.CountsCapped = total >= q.CountLimit
	if len(r.page) == q.Limit {
		out.Next = r.page[len(r.page)-1].ID
	}
	return out, nil
}

// ChildrenPage is a page of a task's children.
type ChildrenPage struct {
	Tasks []TaskSummary
	// Total counts all the task's children.
	Total int
	// Next is the after of the next page; 0 when there is none.
	Next int64
}

// ChildrenAfter reads a page of up to limit (1..5000) children of taskID after
// task id after, in id order, and counts them all. arbortype.ErrNotFound when the
// task does not exist.
func (e *Reader) ChildrenAfter(ctx context.Context, taskID, after int64, limit int) (ChildrenPage, error) {
	type result struct {
		page  []store.TaskSummary
		total int
	}
	r, err := core.Read(ctx, e.core, func(db store.DB) (result, error) {
		p, n, err := e.core.ChildrenPage(ctx, db, taskID, after, limit)
		return result{p, n}, err
	})
	if err != nil {
		return ChildrenPage{}, err
	}
	out := ChildrenPage{Tasks: summaries(r.page), Total: r.total}
	if len(r.page) == limit {
		out.Next = r.page[len(r.page)-1].ID
	}
	return out, nil
}
