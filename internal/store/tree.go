package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Tree queries. Owners always have smaller ids than their children (the
// tasks table checks owner_task_id < id), so ascending id order is ancestors
// first, and descending id order settles every child before its owner.

// The walks down a tree (qLiveSubtreeIDs, and the fork's and the
// prune's) are shaped so that their plan does not depend on statistics: a
// table never analysed (a fan-out of 10,000 children, before autovacuum
// came) is estimated at a few rows, and a plain recursive join then scans
// the whole conversation once per task of the work table, a nested loop
// that took 14.7 s for one abort of 10,001 tasks (33 ms so). Each step is
// a LATERAL subquery fenced by OFFSET 0, so that the planner cannot turn
// it into a join with the work table inside; it looks children up by
// (conversation_id, owner_task_id), tasks_owner_idx, the only index that
// both keys match; and its status test is "not settled" ({settled}), which
// no partial index of the live statuses matches, so that none of those,
// keyed by conversation alone, competes with it when the estimates are
// blind. TestTreeWalksKeepTheirPlanWithoutStatistics checks the plans.
// The abort then locks what it found by primary key (qLockLiveTasks), one
// id at a time in id order (the lock's order), in a LATERAL subquery that
// a lock keeps the planner from flattening: with statistics taken before a
// fan-out, "id IN (SELECT id FROM sub)" was planned as a nested loop over
// the conversation's few estimated rows that compared each with every
// walked id (10,001 tasks: 28.8 s, 0.59 s after ANALYZE); and it settles
// them by primary key too (qSettleMany). An abort locks and settles
// abortChunk tasks per statement (internal/core/tree.go), so that no gap
// between two of its statements grows with the tree (issue 38).
// TestAbortStatementsKeepTheirPlanWithStaleStatistics checks them.
//
// The walks up (a task's owners to the root: qScopeChain, qTaskBudgets,
// and the prune's live_up) are fenced the same way, for the
// same reason: one step is one owner, found by its id, and a plain
// recursive join planned blind hashed the whole conversation at every
// step instead (a scope chain 42 deep under 3,000 siblings read 250,000
// rows, 173 ms, against 250 rows so). Inside the fenced subquery, run once
// per step with the owner's id given, a probe of a unique index by that id
// is the cheapest plan whatever the estimates.
// TestTreeWalksUpKeepTheirPlanWithoutStatistics checks them.
var (
	qLiveSubtreeIDs      = define("LiveSubtreeIDs")
	qLiveConversationIDs = define("LiveConversationIDs")
	qLockLiveTasks       = define("LockLiveTasks")
	qSettleMany          = define("SettleMany")
)

// planAfresh runs a statement as an unnamed prepared statement, planned
// for the arguments and the tables as they are at each execution, not
// from pgx's statement cache: after five executions PostgreSQL keeps a
// named statement's generic plan when it costs no more than the custom
// ones, and a generic plan made while the tasks table held a page or two
// (a new database, statistics taken then) reads the whole table for each
// id, and keeps doing so, the table grown, until its statistics change
// (issue 38: an abort of 5,000 children read 75 million rows in a session
// that had aborted eight tasks before). The statements that take it are
// those whose work grows with their arguments (an abort's, a fork's):
// one plan per execution is nothing beside it.
const planAfresh = pgx.QueryExecModeDescribeExec

// settledStatusList is the settled statuses as an SQL list, {settled} in
// store.SQL, for "status NOT IN ({settled})": a live test that no partial index matches (see
// above).
var settledStatusList = func() string {
	var quoted []string
	for _, st := range arbortype.Statuses {
		if st.Settled() {
			quoted = append(quoted, "'"+string(st)+"'")
		}
	}
	return strings.Join(quoted, ", ")
}()

// LiveSubtreeIDs returns the ids of each live task among rootIDs with
// all its live descendants that are not background (a background child,
// and everything under it, is left out), ascending, without locking them:
// the caller holds the conversation's row lock.
func (s *Store) LiveSubtreeIDs(ctx context.Context, db DB, conv string, rootIDs []int64) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qLiveSubtreeIDs], planAfresh, rootIDs, conv))
}

// LiveConversationTaskIDs returns the ids of every live task of a
// conversation, background ones included, ascending, without locking
// them: the caller holds the conversation's row lock.
func (s *Store) LiveConversationTaskIDs(ctx context.Context, db DB, conv string) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qLiveConversationIDs], planAfresh, conv))
}

// LockLiveTasks locks and returns the live tasks among ids (ascending, of
// conversation conv), in ascending id order; a settled one is left out.
func (s *Store) LockLiveTasks(ctx context.Context, db DB, conv string, ids []int64) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLockLiveTasks], planAfresh, ids, conv))
}

// AbortMany settles every task of ids, of conversation conv, with the
// status at the same index, marks them abort_requested, and numbers their
// settles in the order given: ids[0] settles first. It is the bulk form of
// SettleTask for aborts, and returns the rows as it wrote them, in the
// order of ids.
//
// The tasks among reasonIDs record why as their error (the reason of the
// abort that targeted them).
func (s *Store) AbortMany(ctx context.Context, db DB, conv string, ids []int64, statuses []arbortype.Status, reasonIDs []int64, why *arbortype.TaskError) ([]arbortype.Task, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	var whyJSON []byte
	var err error
	if why != nil {
		if whyJSON, err = marshalError(why); err != nil {
			return nil, err
		}
	}
	if reasonIDs == nil {
		reasonIDs = []int64{}
	}
	// RETURNING is ordered by the settle numbers: the order given.
	return collectTasks(db.Query(ctx, s.sql[qSettleMany], planAfresh, ids, names, reasonIDs, nullJSON(whyJSON), conv))
}
