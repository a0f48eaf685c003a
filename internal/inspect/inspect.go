package inspect

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

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
	// Failed keeps those with a failed turn: a root task failed, not a
	// tool inside a turn that answered.
	Failed bool
	// Awaiting keeps those with a task awaiting an event (an approval).
	Awaiting bool
	// Kind keeps those with a task of this kind.
	Kind string
	// CreatedAfter and CreatedBefore bound when the conversation was
	// created; zero for no bound.
	CreatedAfter, CreatedBefore time.Time
	// Tenant keeps the conversations of that tenant ("" the default
	// one); nil keeps every tenant's.
	Tenant *string
}

// ConversationListing is a conversation as a listing shows it.
type ConversationListing struct {
	// ConversationSummary is the conversation, its lease and its live
	// tasks counted by status.
	arbortype.ConversationSummary
	// Failed says it has a failed turn (a root task).
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
func (e *Reader) QueryConversations(ctx context.Context, q ConversationQuery) (ConversationPage, error) {
	if q.Limit == 0 {
		q.Limit = PageLimitDefault
	}
	if q.Scan == 0 {
		q.Scan = PageScanDefault
	}
	f := store.ConversationFilter{Prefix: q.Prefix, Holder: q.Holder, Live: int(q.Live), Failed: q.Failed,
		Awaiting: q.Awaiting, Kind: q.Kind, Tenant: q.Tenant}
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
			return ConversationPage{}, fmt.Errorf("list conversations: cursor %q is not one of this order: %w", q.Cursor, arbortype.ErrInvalidArgument)
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
				return ConversationPage{}, fmt.Errorf("list conversations: cursor %q is not one of this order: %w", q.Cursor, arbortype.ErrInvalidArgument)
			}
			before = n
		}
		scan, err = core.Read(ctx, e.core, func(db store.DB) (store.ConversationScan, error) {
			return e.core.ConversationsByRecent(ctx, db, f, before, q.Limit, q.Scan)
		})
	default:
		return ConversationPage{}, fmt.Errorf("list conversations: no order %q: %w", q.Order, arbortype.ErrInvalidArgument)
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
func (e *Reader) LiveTaskCounts(ctx context.Context, limit int) (LiveTaskCounts, error) {
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

// TaskBudgets reads the budgets taskID's spend counts against — its own,
// its owners' up to the turn, its conversation's (a wall-time budget's
// Spent is the time elapsed) — and what the task itself spent and holds
// (Spend). arbortype.ErrNotFound when the task does not exist.
func (e *Reader) TaskBudgets(ctx context.Context, taskID int64) (arbortype.ConversationBudgets, error) {
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
func (e *Reader) Holders(ctx context.Context, limit, held int) ([]Holder, error) {
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
func (e *Reader) RecentRestarts(ctx context.Context, scan, limit int) ([]TaskSummary, error) {
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.TaskSummary, error) {
		return e.core.RecentRestarts(ctx, db, scan, limit)
	})
	return summaries(rows), err
}
