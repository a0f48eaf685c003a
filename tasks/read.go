package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// Reads take no lock and run one statement (Children and ConversationTasks
// a second one to tell an unknown id from an empty list). The …Tx forms read
// inside the caller's transaction, so they see its own uncommitted writes.

// Get reads one task. ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, taskID int64) (arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.Task, error) { return e.core.Get(ctx, db, taskID) })
}

// GetTx is Get inside the caller's transaction.
func (e *Engine) GetTx(ctx context.Context, tx pgx.Tx, taskID int64) (arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) (arbortype.Task, error) { return e.core.Get(ctx, db, taskID) })
}

// GetMany reads the tasks with the given ids in ascending id order. An id
// that does not exist is ErrNotFound, naming it.
func (e *Engine) GetMany(ctx context.Context, taskIDs []int64) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.GetMany(ctx, db, taskIDs) })
}

// GetManyTx is GetMany inside the caller's transaction.
func (e *Engine) GetManyTx(ctx context.Context, tx pgx.Tx, taskIDs []int64) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.GetMany(ctx, db, taskIDs) })
}

// Children reads every child of a task (foreground and background, live and
// settled) in ascending id order. ErrNotFound when the task does not exist.
func (e *Engine) Children(ctx context.Context, taskID int64) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.Children(ctx, db, taskID) })
}

// ChildrenTx is Children inside the caller's transaction.
func (e *Engine) ChildrenTx(ctx context.Context, tx pgx.Tx, taskID int64) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.Children(ctx, db, taskID) })
}

// ConversationTasks reads every task of a conversation in ascending id
// order, which is ancestors first. ErrNotFound when the conversation does
// not exist.
func (e *Engine) ConversationTasks(ctx context.Context, conversationID string) ([]arbortype.Task, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) { return e.core.ConversationTasks(ctx, db, conversationID) })
}

// ConversationTasksTx is ConversationTasks inside the caller's transaction.
func (e *Engine) ConversationTasksTx(ctx context.Context, tx pgx.Tx, conversationID string) ([]arbortype.Task, error) {
	return core.ReadIn(ctx, tx, func(db store.DB) ([]arbortype.Task, error) { return e.core.ConversationTasks(ctx, db, conversationID) })
}

// Conversation reads one conversation: its lease holder, epoch and lease
// deadline. ErrNotFound when there is none.
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

// The operator's reads of the web view (package arborui): each reads at
// most a bounded number of rows and pages by keyset — the key of the last
// row a page returned, never an OFFSET — so that a page costs the same
// over 100,000 conversations as over ten. Like ListConversations they have
// no …Tx form.

// TaskSummary is a task as a listing draws it: the row without its
// documents (Input, State, Result, Delivered, Trace, ErrorHistory and
// IdempotencyKey are empty; RetryBackoffBase and RetryBackoffCap zero),
// its Error without Detail and its message cut to 300 characters, and
// WaitIDs cut to the first 20 of WaitCount. Get reads the whole row.
type TaskSummary struct {
	arbortype.Task
	// WaitCount is how many children the task's wait names.
	WaitCount int
}

func summaries(in []store.TaskSummary) []TaskSummary {
	out := make([]TaskSummary, len(in))
	for i, t := range in {
		out[i] = TaskSummary(t)
	}
	return out
}

// ConversationOrder is the order QueryConversations lists in.
type ConversationOrder string

const (
	// OrderRecent lists by each conversation's newest task, the newest
	// first (conversations without tasks are not listed). The zero value.
	OrderRecent ConversationOrder = ""
	// OrderID lists in id order, every conversation.
	OrderID ConversationOrder = "id"
)

// Live selects conversations with or without live work.
type Live int

const (
	// LiveAny lists both. The zero value.
	LiveAny Live = 0
	// LiveOnly lists the conversations with a live task.
	LiveOnly Live = 1
	// LiveNone lists those without one.
	LiveNone Live = -1
)

// Defaults of ConversationQuery, AwaitQuery, TreeQuery and LogQuery.
const (
	// PageLimitDefault is how many rows a page returns.
	PageLimitDefault = 50
	// PageScanDefault is how many rows a page reads to find them.
	PageScanDefault = 10_000
)

// ConversationQuery selects and pages conversations (QueryConversations).
// Every filter is optional.
type ConversationQuery struct {
	// Order is the listing's order. Default OrderRecent.
	Order ConversationOrder
	// Cursor is the Next of the page before; "" for the first page. It is
	// only good with the same Order.
	Cursor string
	// Limit is the most conversations a page returns (1..5000). Default
	// PageLimitDefault (50).
	Limit int
	// Scan is the most rows a page reads to find them (1..100,000):
	// conversations in id order, tasks by recency. A page whose filters
	// keep few of the rows it read returns fewer than Limit, Partial, with
	// a Next that continues after them. Default PageScanDefault (10,000).
	Scan int
	// Prefix keeps the conversations whose id starts with it.
	Prefix string
	// Holder keeps the conversations held by the holder of that name (a
	// runner's node name, or a Lease's).
	Holder string
	// Live keeps those with or without live work. Default LiveAny.
	Live Live
	// Statuses keeps those with a task in one of these live statuses.
	Statuses []arbortype.Status
	// Failed keeps those with a failed task.
	Failed bool
	// Awaiting keeps those with a task awaiting an event (an approval).
	Awaiting bool
	// Kind keeps those with a task of this kind.
	Kind string
	// CreatedAfter and CreatedBefore bound when the conversation was
	// created; zero for no bound.
	CreatedAfter, CreatedBefore time.Time
}

// ConversationListing is a conversation as a listing shows it.
type ConversationListing struct {
	// ConversationSummary is the conversation, its lease and its live
	// tasks counted by status.
	arbortype.ConversationSummary
	// Failed says it has a failed task.
	Failed bool
	// Awaiting counts its tasks awaiting an event.
	Awaiting int
	// LastTaskID, LastKind, LastStatus and LastCreatedAt are its newest
	// task's (LastTaskID 0: it has none).
	LastTaskID    int64
	LastKind      string
	LastStatus    arbortype.Status
	LastCreatedAt *time.Time
}

// ConversationPage is a page of QueryConversations.
type ConversationPage struct {
	Conversations []ConversationListing
	// Next is the cursor of the next page; "" when the listing is over.
	Next string
	// Scanned is how many rows the page read.
	Scanned int
	// Partial says the page read Scan rows and found fewer than Limit that
	// the filters keep: more may follow after Next.
	Partial bool
}

// QueryConversations lists a page of conversations in q.Order, filtered.
// It reads at most q.Scan rows along an index (the conversations' primary
// key, or the tasks' backwards), whatever the number of conversations: a
// page over 100,000 costs what a page over ten does.
func (e *Engine) QueryConversations(ctx context.Context, q ConversationQuery) (ConversationPage, error) {
	if q.Limit == 0 {
		q.Limit = PageLimitDefault
	}
	if q.Scan == 0 {
		q.Scan = PageScanDefault
	}
	f := store.ConversationFilter{Prefix: q.Prefix, Holder: q.Holder, Live: int(q.Live), Failed: q.Failed,
		Awaiting: q.Awaiting, Kind: q.Kind}
	for _, st := range q.Statuses {
		f.Statuses = append(f.Statuses, string(st))
	}
	if !q.CreatedAfter.IsZero() {
		f.CreatedAfter = &q.CreatedAfter
	}
	if !q.CreatedBefore.IsZero() {
		f.CreatedBefore = &q.CreatedBefore
	}
	var (
		scan store.ConversationScan
		err  error
	)
	switch q.Order {
	case OrderID:
		after, ok := strings.CutPrefix(q.Cursor, "i")
		if !ok && q.Cursor != "" {
			return ConversationPage{}, fmt.Errorf("list conversations: cursor %q is not one of this order: %w", q.Cursor, ErrInvalidArgument)
		}
		scan, err = core.Read(ctx, e.core, func(db store.DB) (store.ConversationScan, error) {
			return e.core.ConversationsByID(ctx, db, f, after, q.Limit, q.Scan)
		})
	case OrderRecent:
		before := int64(math.MaxInt64)
		if q.Cursor != "" {
			s, ok := strings.CutPrefix(q.Cursor, "r")
			n, perr := strconv.ParseInt(s, 10, 64)
			if !ok || perr != nil || n < 1 {
				return ConversationPage{}, fmt.Errorf("list conversations: cursor %q is not one of this order: %w", q.Cursor, ErrInvalidArgument)
			}
			before = n
		}
		scan, err = core.Read(ctx, e.core, func(db store.DB) (store.ConversationScan, error) {
			return e.core.ConversationsByRecent(ctx, db, f, before, q.Limit, q.Scan)
		})
	default:
		return ConversationPage{}, fmt.Errorf("list conversations: no order %q: %w", q.Order, ErrInvalidArgument)
	}
	if err != nil {
		return ConversationPage{}, err
	}
	out := ConversationPage{Scanned: scan.Scanned}
	for _, r := range scan.Rows {
		out.Conversations = append(out.Conversations, ConversationListing{ConversationSummary: r.ConversationSummary,
			Failed: r.Failed, Awaiting: r.Awaiting, LastTaskID: r.LastID, LastKind: r.LastKind, LastStatus: r.LastStatus,
			LastCreatedAt: r.LastCreatedAt})
	}
	full := len(scan.Rows) == q.Limit
	more := full || scan.Scanned == q.Scan
	out.Partial = !full && more
	switch {
	case !more:
	case q.Order == OrderID && full:
		out.Next = "i" + scan.Rows[len(scan.Rows)-1].ID
	case q.Order == OrderID:
		out.Next = "i" + scan.LastID
	case full:
		out.Next = "r" + strconv.FormatInt(scan.Rows[len(scan.Rows)-1].LastID, 10)
	case scan.LastKey > 1:
		out.Next = "r" + strconv.FormatInt(scan.LastKey, 10)
	}
	return out, nil
}

// LiveTaskCounts are the live tasks across conversations, as
// Engine.LiveTaskCounts counts them.
type LiveTaskCounts struct {
	// ByStatus counts the live tasks by status.
	ByStatus map[arbortype.Status]int
	// Awaiting counts the tasks awaiting an event.
	Awaiting int
	// Capped says a count reached the read's bound: the true count is at
	// least that.
	Capped bool
}

// LiveTaskCounts counts the live tasks across conversations by status,
// and those awaiting an event, reading at most limit (1..1,000,000) rows
// of each: a count that reaches it is reported Capped, not exact.
func (e *Engine) LiveTaskCounts(ctx context.Context, limit int) (LiveTaskCounts, error) {
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.LiveCount, error) { return e.core.LiveCounts(ctx, db, limit) })
	if err != nil {
		return LiveTaskCounts{}, err
	}
	out := LiveTaskCounts{ByStatus: map[arbortype.Status]int{}}
	live := 0
	for _, r := range rows {
		if r.Status == "awaiting" {
			out.Awaiting = r.N
			out.Capped = out.Capped || r.N >= limit
			continue
		}
		out.ByStatus[arbortype.Status(r.Status)] = r.N
		live += r.N
	}
	out.Capped = out.Capped || live >= limit
	return out, nil
}

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
func (e *Engine) Awaits(ctx context.Context, q AwaitQuery) (AwaitPage, error) {
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
			return AwaitPage{}, fmt.Errorf("list awaits: cursor %q: %w", q.Cursor, ErrInvalidArgument)
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
// not all of it. ErrNotFound when the conversation does not exist.
func (e *Engine) Tree(ctx context.Context, q TreeQuery) (TreePage, error) {
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
// task id after, in id order, and counts them all. ErrNotFound when the
// task does not exist.
func (e *Engine) ChildrenAfter(ctx context.Context, taskID, after int64, limit int) (ChildrenPage, error) {
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

// LogQuery reads a page of a conversation's log (Engine.ReadLogPage).
type LogQuery struct {
	ConversationID string
	// TaskID keeps the entries of one task; 0 keeps all.
	TaskID int64
	// After, when not 0, reads the entries after it, in order (a tail
	// that follows). Otherwise the page is of the entries below Before (0:
	// from the newest), the newest first.
	After, Before int64
	// Limit is the most entries a page returns (1..5000). Default
	// PageLimitDefault (50).
	Limit int
	// Scan bounds, for a task's entries below Before, how many of the
	// conversation's entries are read to find them (1..100,000; the log
	// has no index by task). Default PageScanDefault (10,000).
	Scan int
	// MaxPayload is the most characters of a payload returned
	// (1..1,048,576); a longer one is cut (see LogListing). Default 4096.
	MaxPayload int
}

// MaxPayloadDefault is LogQuery's and TaskEvents's default cut.
const MaxPayloadDefault = 4096

// LogListing is a log entry whose payload may be cut: when PayloadBytes
// is over len(Payload), Payload is the first characters of the payload's
// text and no longer JSON.
type LogListing struct {
	arbortype.LogEntry
	// PayloadBytes is the size of the whole payload's text.
	PayloadBytes int
}

// Cut says the payload was cut.
func (l LogListing) Cut() bool { return l.PayloadBytes > len(l.Payload) }

// LogPage is a page of a conversation's log.
type LogPage struct {
	Entries []LogListing
	// Older is the Before of the page of older entries; 0 when there are
	// none. (After a page read with After, take the last entry's Seq.)
	Older int64
}

// ReadLogPage reads a page of a conversation's log, payloads cut to
// q.MaxPayload: a tail after q.After, or the entries below q.Before,
// newest first. A task's entries below q.Before are looked for among
// q.Scan entries of the conversation's, and Older continues below those.
// ErrNotFound when the conversation does not exist.
func (e *Engine) ReadLogPage(ctx context.Context, q LogQuery) (LogPage, error) {
	if q.Limit == 0 {
		q.Limit = PageLimitDefault
	}
	if q.Scan == 0 {
		q.Scan = PageScanDefault
	}
	if q.MaxPayload == 0 {
		q.MaxPayload = MaxPayloadDefault
	}
	type result struct {
		rows    []store.LogRow
		scanned int
		low     int64
	}
	r, err := core.Read(ctx, e.core, func(db store.DB) (result, error) {
		rows, n, low, err := e.core.LogPage(ctx, db, q.ConversationID, q.TaskID, q.After, q.Before, q.Limit, q.Scan, q.MaxPayload)
		return result{rows, n, low}, err
	})
	if err != nil {
		return LogPage{}, err
	}
	out := LogPage{}
	for _, row := range r.rows {
		out.Entries = append(out.Entries, LogListing{LogEntry: arbortype.LogEntry(row.LogEntry), PayloadBytes: row.PayloadBytes})
	}
	switch {
	case q.After > 0:
	case q.TaskID != 0 && len(r.rows) == q.Limit:
		out.Older = r.rows[len(r.rows)-1].Seq
	case q.TaskID != 0 && r.scanned == q.Scan && r.low > 1:
		out.Older = r.low
	case q.TaskID == 0 && len(r.rows) == q.Limit && r.rows[len(r.rows)-1].Seq > 1:
		out.Older = r.rows[len(r.rows)-1].Seq
	}
	return out, nil
}

// LastLogSeq returns the seq of the newest entry of any conversation's
// log (0: none), in one probe of the log's primary key: a cheap test of
// whether anything was logged since the last call.
func (e *Engine) LastLogSeq(ctx context.Context) (int64, error) {
	return core.Read(ctx, e.core, func(db store.DB) (int64, error) { return e.core.LastLogSeq(ctx, db) })
}

// EventListing is an event whose payload may be cut, as LogListing's.
type EventListing struct {
	arbortype.Event
	// PayloadBytes is the size of the whole payload's text.
	PayloadBytes int
}

// Cut says the payload was cut.
func (l EventListing) Cut() bool { return l.PayloadBytes > len(l.Payload) }

// TaskEvents reads up to limit (1..5000) events addressed or delivered to
// taskID, the newest first, payloads cut to maxPayload characters (0:
// MaxPayloadDefault). ErrNotFound when the task does not exist.
func (e *Engine) TaskEvents(ctx context.Context, taskID int64, limit, maxPayload int) ([]EventListing, error) {
	if maxPayload == 0 {
		maxPayload = MaxPayloadDefault
	}
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.EventRow, error) {
		return e.core.TaskEvents(ctx, db, taskID, limit, maxPayload)
	})
	if err != nil {
		return nil, err
	}
	out := make([]EventListing, len(rows))
	for i, r := range rows {
		out[i] = EventListing{Event: event(r.Event), PayloadBytes: r.PayloadBytes}
	}
	return out, nil
}

// TaskBudgets reads the budgets taskID's spend counts against — its own,
// its owners' up to the turn, its conversation's (a wall-time budget's
// Spent is the time elapsed) — and what the task itself spent and holds
// (Spend). ErrNotFound when the task does not exist.
func (e *Engine) TaskBudgets(ctx context.Context, taskID int64) (arbortype.ConversationBudgets, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.ConversationBudgets, error) {
		bs, spend, err := e.core.TaskBudgets(ctx, db, taskID)
		if err != nil {
			return arbortype.ConversationBudgets{}, err
		}
		out := arbortype.ConversationBudgets{Budgets: bs}
		for _, s := range spend {
			out.Spend = append(out.Spend, arbortype.Spend(s))
		}
		return out, nil
	})
}

// Holder is one life of a holder — a runner's node from its start (or
// from a new life after its lease expired) to its stop, or one Lease —
// as the holders table records it.
type Holder struct {
	ID   int64
	Name string
	// ExpiresAt is its lease's deadline, RenewedAt its last renewal,
	// CreatedAt the start of the life; Now the database's clock at the
	// read, to tell them apart by.
	ExpiresAt, RenewedAt, CreatedAt, Now time.Time
	// Held counts the conversations that name it, up to the read's bound
	// (HeldCapped: at least that many). A life whose deadline passed
	// with conversations still named has lapsed: another holder takes
	// them over.
	Held       int
	HeldCapped bool
}

// Holders reads up to limit (1..5000) holder rows, by name then newest
// first, each with the conversations it holds counted up to held
// (1..1,000,000).
func (e *Engine) Holders(ctx context.Context, limit, held int) ([]Holder, error) {
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.HolderRow, error) { return e.core.Holders(ctx, db, limit, held) })
	if err != nil {
		return nil, err
	}
	out := make([]Holder, len(rows))
	for i, r := range rows {
		out[i] = Holder{ID: r.ID, Name: r.Name, ExpiresAt: r.ExpiresAt, RenewedAt: r.RenewedAt, CreatedAt: r.CreatedAt,
			Now: r.Now, Held: r.Held, HeldCapped: r.Held >= held}
	}
	return out, nil
}

// RecentRestarts reads up to limit (1..5000) tasks that were recovered as
// restarts (Attempt > 0: their holder died or lost its lease while they
// ran) among the scan (1..100,000) newest tasks, the newest first.
func (e *Engine) RecentRestarts(ctx context.Context, scan, limit int) ([]TaskSummary, error) {
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.TaskSummary, error) {
		return e.core.RecentRestarts(ctx, db, scan, limit)
	})
	return summaries(rows), err
}
