package store

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/arborhq/arbor/arbortype"
)

// Tree queries. Owners always have smaller ids than their children (the
// tasks table checks owner_task_id < id), so ascending id order is ancestors
// first, and descending id order settles every child before its owner.

// The walks down a tree (qLockLiveSubtrees, and the fork's and the
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
// The abort's walk then locks what it found by primary key, one id at a
// time in id order (the lock's order), in a LATERAL subquery that a lock
// keeps the planner from flattening: with statistics taken before a
// fan-out, "id IN (SELECT id FROM sub)" was planned as a nested loop over
// the conversation's few estimated rows that compared each with every
// walked id (10,001 tasks: 28.8 s, 0.59 s after ANALYZE).
// TestAbortWalkKeepsItsPlanWithStaleStatistics checks it.
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
	qLockLiveSubtrees = define(expand(`WITH RECURSIVE sub(id) AS (
			SELECT id FROM {schema}.tasks
			WHERE conversation_id = $2 AND id = ANY($1) AND status NOT IN ({settled})
			UNION
			SELECT c.id FROM sub s CROSS JOIN LATERAL (SELECT t.id FROM {schema}.tasks t
				WHERE t.conversation_id = $2 AND t.owner_task_id = s.id
				  AND t.status NOT IN ({settled}) AND NOT t.background OFFSET 0) c)
		SELECT l.* FROM (SELECT DISTINCT id FROM sub ORDER BY id) s
		CROSS JOIN LATERAL (SELECT {task_columns} FROM {schema}.tasks
			WHERE id = s.id AND conversation_id = $2 FOR NO KEY UPDATE) l
		ORDER BY l.id`, "{settled}", settledStatusList))

	qLockLiveConversation = define(`SELECT {task_columns} FROM {schema}.tasks
		WHERE conversation_id = $1 AND status IN ({live})
		ORDER BY id FOR NO KEY UPDATE`)

	qNextSettleSeqs = define(`SELECT nextval('{schema}.task_settle_seq'::regclass) FROM generate_series(1, $1)`)

	// v's columns are named apart from the tasks', which RETURNING lists
	// unqualified.
	qSettleMany = define(logged(`UPDATE {schema}.tasks t
		SET status = v.to_status, settle_seq = v.seq, abort_requested = true,
		    settled_at = now(), token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
		    error = CASE WHEN t.id = ANY($4) THEN $5::jsonb ELSE t.error END
		FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS v(task_id, to_status, seq)
		WHERE t.id = v.task_id`, "t", "{task_columns}", "ORDER BY settle_seq"))
)

// settledStatusList is the settled statuses as an SQL list, for "status
// NOT IN ({settled})": a live test that no partial index matches (see
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

// LockLiveSubtrees locks and returns each live task among rootIDs with all
// its live descendants that are not background (a background child, and
// everything under it, is left out), in ascending id order.
func (s *Store) LockLiveSubtrees(ctx context.Context, db DB, conv string, rootIDs []int64) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLockLiveSubtrees], rootIDs, conv))
}

// LockLiveConversationTasks locks and returns every live task of a
// conversation, background ones included, in ascending id order.
func (s *Store) LockLiveConversationTasks(ctx context.Context, db DB, conversationID string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qLockLiveConversation], conversationID))
}

// AbortMany settles every task of ids with the status at the same index,
// marks them abort_requested, and numbers their settles in the order given:
// ids[0] settles first. It is the bulk form of SettleTask for aborts, and
// returns the rows as it wrote them, in the order of ids.
//
// The tasks among reasonIDs record why as their error (the reason of the
// abort that targeted them).
func (s *Store) AbortMany(ctx context.Context, db DB, ids []int64, statuses []arbortype.Status, reasonIDs []int64, why *arbortype.TaskError) ([]arbortype.Task, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	seqs, err := collect[int64](db.Query(ctx, s.sql[qNextSettleSeqs], len(ids)))
	if err != nil {
		return nil, err
	}
	// One session's nextval calls increase; sort anyway so the order given
	// is the order recorded whatever the series returned.
	slices.Sort(seqs)
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	var whyJSON []byte
	if why != nil {
		if whyJSON, err = marshalError(why); err != nil {
			return nil, err
		}
	}
	if reasonIDs == nil {
		reasonIDs = []int64{}
	}
	settled, err := collectTasks(db.Query(ctx, s.sql[qSettleMany], ids, names, seqs, reasonIDs, nullJSON(whyJSON)))
	if err != nil {
		return nil, err
	}
	// RETURNING has no order: the settle numbers are the order given.
	slices.SortFunc(settled, func(a, b arbortype.Task) int { return cmp.Compare(a.SettleSeq, b.SettleSeq) })
	return settled, nil
}
