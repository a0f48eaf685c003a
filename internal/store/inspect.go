package store

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Queries for operators (the arbor command's ls, the web view). Unlike the engine's
// queries they span conversations, so they read only: they take no lock and
// are never part of an operation's transaction.

var qLiveConversations = define("LiveConversations")

// LiveConversations lists the conversations that have live tasks, in id
// order, at most limit of them (0: no limit). With statuses given, only the
// conversations with a live task in one of them are listed (their counts
// still cover every live status).
func (s *Store) LiveConversations(ctx context.Context, db DB, statuses []arbortype.Status, limit int) ([]arbortype.ConversationSummary, error) {
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	rows, err := db.Query(ctx, s.sql[qLiveConversations], names, lim)
	if err != nil {
		return nil, err
	}
	// One row per conversation and live status, a conversation's rows
	// together: folded into one summary each.
	var (
		out         []arbortype.ConversationSummary
		c           arbortype.ConversationSummary
		status      string
		n, awaiting int
	)
	_, err = pgx.ForEachRow(rows, []any{&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &c.Tenant, &status, &n, &awaiting}, func() error {
		if len(out) == 0 || out[len(out)-1].ID != c.ID {
			c.Live = map[arbortype.Status]int{}
			c.Awaiting = 0
			out = append(out, c)
		}
		out[len(out)-1].Live[arbortype.Status(status)] = n
		out[len(out)-1].Awaiting += awaiting
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

var qRecentConversations = define("RecentConversations")

// RecentConversations lists up to limit conversations that had a task
// created lately, the most recent first: those of the newest
// 1,000 tasks, live or settled. It reads those tasks backwards along the
// primary key, so that it costs the same on a table of a billion tasks as
// on one of a thousand.
func (s *Store) RecentConversations(ctx context.Context, db DB, limit int) ([]arbortype.Conversation, error) {
	rows, err := db.Query(ctx, s.sql[qRecentConversations], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (arbortype.Conversation, error) {
		var c arbortype.Conversation
		err := row.Scan(&c.ID, &c.Holder, &c.Epoch, &c.LeaseExpiresAt, &c.CreatedAt, &c.Tenant)
		return c, err
	})
}

// The web view's reads (package arborui). Each is bounded: it reads at
// most a number of rows its caller chooses, in the order of an index, and
// pages by a keyset (the last key it returned), never by OFFSET, so that
// a page costs the same at the 100,000th conversation as at the first.

// summaryColumns is the SELECT list of summaryColumnList, {summary_columns}
// in store.SQL.
var summaryColumns = columnSQL(summaryColumnList)

// summaryColumnList is a task row as a listing draws it: without its
// documents (input, state, result, delivered, trace, error history), its
// error without detail and its message cut to summaryMessage characters,
// its wait's ids cut to the first summaryWaitIDs (a turn that waits on
// 100,000 children has as many). A query reads it with its SELECT list
// (summaryColumns) and one more column, the wait's whole count.
var summaryColumnList = func() []taskColumn {
	swap := map[string]string{
		"wait_ids": "wait_ids[1:" + strconv.Itoa(summaryWaitIDs) + "]",
		"error": `CASE WHEN error IS NULL THEN NULL ELSE jsonb_strip_nulls(jsonb_build_object(
			'code', error->'code', 'message', left(error->>'message', ` + strconv.Itoa(summaryMessage) + `),
			'non_retryable', error->'non_retryable')) END`,
	}
	skip := map[string]bool{"input": true, "state": true, "result": true, "error_history": true, "delivered": true,
		"trace": true, "retry_backoff_base": true, "retry_backoff_cap": true, "coalesce(wake_job_id, 0)": true,
		"coalesce(idempotency_key, '')": true}
	var out []taskColumn
	for _, c := range taskColumnList {
		if skip[c.sql] {
			continue
		}
		if s, ok := swap[c.sql]; ok {
			c.sql = s
		}
		out = append(out, c)
	}
	return out
}()

const (
	summaryWaitIDs = 20
	summaryMessage = 300
)

// TaskSummary is a task row as summaryColumnList reads it, with the count
// of its whole wait.
type TaskSummary struct {
	arbortype.Task
	WaitCount int
}

func collectSummaries(rows pgx.Rows, err error) ([]TaskSummary, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskSummary, error) {
		var n int
		t, err := scanColumns(summaryColumnList, row, &n)
		return TaskSummary{Task: t, WaitCount: n}, err
	})
}

// ConversationFilter selects conversations in a listing; its zero value
// selects every one.
type ConversationFilter struct {
	// Prefix keeps the ids that start with it.
	Prefix string
	// Holder keeps the conversations held by the holder of that name.
	Holder string
	// Live: 1 keeps those with a live task, -1 those without, 0 both.
	Live int
	// Statuses keeps those with a task in one of these live statuses.
	Statuses []string
	// Failed keeps those with a failed turn (a root task: not a tool that
	// failed inside a turn that answered); Awaiting those with a task
	// awaiting an event.
	Failed, Awaiting bool
	// Kind keeps those with a task of that kind.
	Kind string
	// CreatedAfter and CreatedBefore bound the conversation's creation.
	CreatedAfter, CreatedBefore *time.Time
	// Tenant keeps the conversations of that tenant ("" the default one);
	// nil keeps every tenant's.
	Tenant *string
}

// ConversationRow is a conversation as a listing shows it.
type ConversationRow struct {
	arbortype.ConversationSummary
	// Failed: it has a failed turn (a root task); Awaiting counts its
	// tasks awaiting an event.
	Failed   bool
	Awaiting int
	// Last is its newest task (ID 0: it has none).
	LastID        int64
	LastKind      string
	LastStatus    arbortype.Status
	LastCreatedAt *time.Time
}

// ConversationScan is what a listing's page read: Rows, and how many rows
// the scan behind them read (Scanned) up to which key (Last: a
// conversation id by id, a task id by recency).
type ConversationScan struct {
	Rows    []ConversationRow
	Scanned int
	LastID  string
	LastKey int64
}

var (
	qConversationsByID     = define("ConversationsByID")
	qConversationsByRecent = define("ConversationsByRecent")
)

func filterArgs(f ConversationFilter) []any {
	st := f.Statuses
	if st == nil {
		st = []string{}
	}
	return []any{f.Prefix, f.Holder, f.Live, st, f.Failed, f.Awaiting, f.Kind, f.CreatedAfter, f.CreatedBefore, f.Tenant}
}

// ConversationsByID lists up to limit conversations the filter keeps
// among the next scan after id after (""), in id order.
func (s *Store) ConversationsByID(ctx context.Context, db DB, f ConversationFilter, after string, limit, scan int) (ConversationScan, error) {
	args := append([]any{after, limit, scan}, filterArgs(f)...)
	return scanConversationRows(db.Query(ctx, s.sql[qConversationsByID], args...))
}

// ConversationsByRecent lists up to limit conversations the filter keeps
// among those of the next scan tasks below task id before, the newest
// first.
func (s *Store) ConversationsByRecent(ctx context.Context, db DB, f ConversationFilter, before int64, limit, scan int) (ConversationScan, error) {
	args := append([]any{before, limit, scan}, filterArgs(f)...)
	return scanConversationRows(db.Query(ctx, s.sql[qConversationsByRecent], args...))
}

func scanConversationRows(rows pgx.Rows, err error) (ConversationScan, error) {
	var out ConversationScan
	if err != nil {
		return out, err
	}
	// Every row carries the scan's figures; a row of nulls beside them
	// stands for no conversation. The scan allocates each pointer's value
	// afresh (and a NULL sets it nil), so what a row keeps is its own.
	var (
		id, holder, tenant, lastKind, lastStatus *string
		epoch, lastID                            *int64
		lease, created, lastCreated              *time.Time
		live                                     map[string]int
		failed                                   *bool
		awaiting                                 *int
		key                                      *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&out.Scanned, &out.LastID, &out.LastKey, &id, &holder, &epoch, &lease, &created, &tenant, &live, &failed,
		&awaiting, &lastID, &lastKind, &lastStatus, &lastCreated, &key}, func() error {
		if id == nil {
			return nil // the row of nulls: nothing kept
		}
		r := ConversationRow{Failed: *failed, Awaiting: *awaiting, LastID: *lastID, LastKind: *lastKind,
			LastStatus: arbortype.Status(*lastStatus), LastCreatedAt: lastCreated}
		r.Conversation = arbortype.Conversation{ID: *id, Holder: *holder, Epoch: *epoch, LeaseExpiresAt: lease, CreatedAt: *created, Tenant: *tenant}
		r.Live = map[arbortype.Status]int{}
		for st, n := range live {
			r.Live[arbortype.Status(st)] = n
		}
		out.Rows = append(out.Rows, r)
		return nil
	})
	return out, err
}

// LiveCount is how many tasks, across conversations, are in a live status
// (Status) or await an event (Status "awaiting").
type LiveCount struct {
	Status string
	N      int
}

// At most $1 rows are counted of each: the live index, and the awaiting
// index, read that far.
var qLiveCounts = define("LiveCounts")

// LiveCounts counts the live tasks by status, and the tasks awaiting an
// event, reading at most limit rows of each.
func (s *Store) LiveCounts(ctx context.Context, db DB, limit int) ([]LiveCount, error) {
	rows, err := db.Query(ctx, s.sql[qLiveCounts], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LiveCount, error) {
		var c LiveCount
		err := row.Scan(&c.Status, &c.N)
		return c, err
	})
}

var (
	qTaskBudgets = define("TaskBudgets")
	qTaskSpend   = define("TaskSpend")
)

// TaskBudgets reads the budgets taskID's spend counts against (its own,
// its owners', its conversation's) and what it spent and holds itself.
func (s *Store) TaskBudgets(ctx context.Context, db DB, conv string, taskID int64) ([]BudgetRow, []TaskSpend, error) {
	budgets, err := collectBudgets(db.Query(ctx, s.sql[qTaskBudgets], conv, taskID))
	if err != nil {
		return nil, nil, err
	}
	rows, err := db.Query(ctx, s.sql[qTaskSpend], conv, taskID)
	if err != nil {
		return nil, nil, err
	}
	spend, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskSpend, error) {
		var t TaskSpend
		err := row.Scan(&t.TaskID, &t.Counter, &t.Spent, &t.Reserved)
		return t, err
	})
	return budgets, spend, err
}

// HolderRow is a row of the holders table: one life of a runner's node
// or of a Lease, with how many conversations name it.
type HolderRow struct {
	ID                              int64
	Name                            string
	ExpiresAt, RenewedAt, CreatedAt time.Time
	// Now is the database's clock at the read.
	Now time.Time
	// Held counts the conversations that name the row, up to the read's
	// bound.
	Held int
}

// Every holder row (a life), by name and newest first, with the
// conversations naming it counted along the holder index, at most $2.
var qHolders = define("Holders")

// Holders reads up to limit holder rows, by name then newest first, each
// with the conversations it holds counted up to held.
func (s *Store) Holders(ctx context.Context, db DB, limit, held int) ([]HolderRow, error) {
	rows, err := db.Query(ctx, s.sql[qHolders], limit, held)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (HolderRow, error) {
		var h HolderRow
		err := row.Scan(&h.ID, &h.Name, &h.ExpiresAt, &h.RenewedAt, &h.CreatedAt, &h.Now, &h.Held)
		return h, err
	})
}

// The tasks recovered as restarts (attempt > 0) among the newest $1, along
// the primary key backwards.
var qRecentRestarts = define("RecentRestarts")

// RecentRestarts reads up to limit tasks with attempt > 0 among the scan
// newest tasks, the newest first.
func (s *Store) RecentRestarts(ctx context.Context, db DB, scan, limit int) ([]TaskSummary, error) {
	return collectSummaries(db.Query(ctx, s.sql[qRecentRestarts], scan, limit))
}
