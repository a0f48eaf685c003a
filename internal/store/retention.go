package store

import (
	publicstore "github.com/arborhq/arbor/store"

	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Retention: the prune's statements (docs/operations.md, "Retention").
//
// The prune deletes settled turns (a root task with its whole subtree) and
// whole conversations. Its transactions are marked (MarkPrune), without
// which the guards refuse every delete of a task, a conversation or a row
// of theirs; the guard also
// checks every deleted task semantically (guardrules.DeleteRules), whatever the
// statement that deletes it.

// steeredCode is arbortype.CodeSteered, the error code of a steered
// message's own turn that another turn took.
const steeredCode = arbortype.CodeSteered

// dependent is a table whose rows belong to tasks, or to a conversation,
// and go with them, deleted before the tasks they refer to.
type dependent struct {
	// name is how a summary counts the table's rows.
	name string
	// table is the table.
	table string
	// key identifies a row (for the bounded deletes of a conversation's rows).
	key string
	// ofTasks selects the rows of tasks $2 (bigint[]) of conversation $1.
	ofTasks string
	// ofConversation selects every row of conversation $1.
	ofConversation string
	// beforeTasks, when set, runs (conversation $1, tasks $2) before the
	// rows of pruned tasks are deleted: what must outlive them.
	beforeTasks string
}

// dependents are what a pruned task or conversation takes with it. A
// table that refers to tasks or conversations is one more line here.
var dependents = []dependent{
	// A pruned task's budgets go with it; its reservations too, their spend
	// carried into the conversation's budgets (a session's spend outlives
	// its pruned turns; an open one is spent in full, its run long over).
	{name: "budgets", table: "budgets", key: "ctid",
		ofTasks:        `conversation_id = $1 AND task_id = ANY($2::bigint[])`,
		ofConversation: `conversation_id = $1`},
	{name: "budget_reservations", table: "budget_reservations", key: "id",
		ofTasks:        `conversation_id = $1 AND task_id = ANY($2::bigint[])`,
		ofConversation: `conversation_id = $1`,
		beforeTasks: `UPDATE {schema}.budgets b
			SET carried = b.carried + s.gone, spent = b.spent + s.open, reserved = b.reserved - s.open, updated_at = now()
			FROM (SELECT counter, sum(coalesce(actual, amount)) AS gone, coalesce(sum(amount) FILTER (WHERE actual IS NULL), 0) AS open
				FROM {schema}.budget_reservations WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]) GROUP BY counter) s
			WHERE b.conversation_id = $1 AND b.task_id IS NULL AND b.counter = s.counter`},
	{name: "events", table: "events", key: "id",
		ofTasks:        `conversation_id = $1 AND (task_id = ANY($2::bigint[]) OR delivered_to = ANY($2::bigint[]))`,
		ofConversation: `conversation_id = $1`},
	{name: "log_entries", table: "conversation_log", key: "seq",
		ofTasks:        `conversation_id = $1 AND task_id = ANY($2::bigint[])`,
		ofConversation: `conversation_id = $1`},
	// Wake jobs are found through River's GIN index on args, one task at a
	// time; a running one (its worker holds it) is left to River.
	{name: "wake_jobs", table: "river_job", key: "id",
		ofTasks: `id IN (SELECT j.id FROM unnest($2::bigint[]) t(id) CROSS JOIN LATERAL (
			SELECT id FROM {schema}.river_job WHERE kind = '` + WakeJobKind + `' AND args @> jsonb_build_object('task_id', t.id)
			  AND state <> 'running' AND $1::text IS NOT NULL) j)`,
		ofConversation: `kind = '` + WakeJobKind + `' AND args @> jsonb_build_object('conversation_id', $1::text) AND state <> 'running'`},
}

// DependentNames are the names a prune's summary counts, in order.
func DependentNames() []string {
	names := make([]string, len(dependents))
	for i, d := range dependents {
		names[i] = d.name
	}
	return names
}

var (
	qBeforeTasks = func() (before []query) {
		for _, d := range dependents {
			q := query(-1)
			if d.beforeTasks != "" {
				q = define(d.beforeTasks)
			}
			before = append(before, q)
		}
		return
	}()
	qDeleteOfTasks, qCountOfTasks, qDeleteOfConversation, qCountOfConversation = func() (del, cnt, delConv, cntConv []query) {
		for _, d := range dependents {
			del = append(del, define(`DELETE FROM {schema}.`+d.table+` WHERE `+d.ofTasks))
			cnt = append(cnt, define(`SELECT count(*) FROM {schema}.`+d.table+` WHERE `+d.ofTasks))
			// = ANY(ARRAY(…)): the batch's keys looked up one by one (an
			// index, or a TID scan for ctid), never a scan of the table.
			delConv = append(delConv, define(`DELETE FROM {schema}.`+d.table+` WHERE `+d.key+` = ANY(ARRAY(
				SELECT `+d.key+` FROM {schema}.`+d.table+` WHERE `+d.ofConversation+` LIMIT $2))`))
			cntConv = append(cntConv, define(`SELECT count(*) FROM {schema}.`+d.table+` WHERE `+d.ofConversation+` AND $2::int IS NOT NULL`))
		}
		return
	}()

	// The prune's own River jobs, finished longer than $1 ago.
	qPruneFinishedPruneJobs = define(`DELETE FROM {schema}.river_job
		WHERE kind = '` + PruneJobKind + `' AND finalized_at < now() - $1 * interval '1 microsecond'`)

	// The prune's mark (migration 019): the transaction's id in
	// prune_marks, which only the prune's role may write; removed before
	// the transaction commits.
	qMarkPrune   = define(`INSERT INTO {schema}.prune_marks DEFAULT VALUES ON CONFLICT DO NOTHING`)
	qUnmarkPrune = define(`DELETE FROM {schema}.prune_marks WHERE txid = pg_current_xact_id()`)
	qPruneCutoff = define(`SELECT now() - $1 * interval '1 microsecond'`)

	// Settled turns settled before $1, after the cursor ($2, $3), oldest
	// first, across conversations (tasks_settled_roots_idx).
	qPruneCandidates = define(`SELECT conversation_id, settled_at, id FROM {schema}.tasks
		WHERE owner_task_id IS NULL AND settled_at IS NOT NULL AND settled_at < $1
		  AND (settled_at, id) > ($2, $3)
		ORDER BY settled_at, id LIMIT $4`)

	// Conversations created before $1 with no task left (after the cursor
	// $2, in id order): what a prune that deleted a conversation's tasks
	// but not the conversation (a holder still had its lease) left, and
	// conversations that never had a task.
	qEmptyConversations = define(`SELECT c.id FROM {schema}.conversations c
		WHERE c.created_at < $1 AND c.id > $2
		  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id)
		ORDER BY c.id LIMIT $3`)

	// The conversation, locked for a prune's batch: skipped (no row) while
	// another transaction holds it. held says a live holder has its lease.
	qLockConversationForPrune = define(`SELECT ` + heldLive + `
		FROM {schema}.conversations c WHERE c.id = $1 FOR UPDATE OF c SKIP LOCKED`)

	// Whether conversation $1 has a live holder, read without a lock: what
	// a dry run needs to know the batch's LockConversationForPrune would
	// say.
	qConversationHeld = define(`SELECT ` + heldLive + ` FROM {schema}.conversations c WHERE c.id = $1`)

	// What a prune may delete of conversation $1 with cutoff $2: the tasks
	// of its ripe turns (up to $3, newest id first, so that every task's
	// descendants come with it), and whether the conversation is wholly
	// out of use. A turn is ripe when no task of its tree is live and every
	// one settled before the cutoff, and, while the conversation is in use
	// (a live task, or anything newer than the cutoff), it is neither the
	// conversation's newest settled turn nor its newest settled turn that
	// is not a steered message's (cancelled because another turn took the
	// message: the turn that answered is the context to keep). Its walks,
	// up from the live tasks and down from the roots, are shaped as the
	// abort's (internal/store/tree.go), so that their plans do not depend on
	// statistics.
	qPruneVictims = define(`WITH RECURSIVE
		live_up AS (
			SELECT t.id, t.owner_task_id FROM {schema}.tasks t WHERE t.conversation_id = $1 AND t.status IN ({live})
			UNION
			SELECT o.id, o.owner_task_id FROM live_up l CROSS JOIN LATERAL (SELECT o.id, o.owner_task_id FROM {schema}.tasks o
				WHERE o.conversation_id = $1 AND o.id = l.owner_task_id OFFSET 0) o),
		in_use AS (SELECT EXISTS (SELECT 1 FROM live_up)
			OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = $1 AND (t.settled_at >= $2 OR t.created_at >= $2))
			OR EXISTS (SELECT 1 FROM {schema}.events e WHERE e.conversation_id = $1 AND e.emitted_at >= $2)
			OR EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.id = $1 AND c.created_at >= $2) AS v),
		newest AS (SELECT max(id) AS id FROM {schema}.tasks
			WHERE conversation_id = $1 AND owner_task_id IS NULL AND status NOT IN ({live})),
		newest_answer AS (SELECT max(id) AS id FROM {schema}.tasks
			WHERE conversation_id = $1 AND owner_task_id IS NULL AND status NOT IN ({live})
			  AND error->>'code' IS DISTINCT FROM '` + steeredCode + `'),
		roots AS (
			SELECT r.id FROM {schema}.tasks r
			WHERE r.conversation_id = $1 AND r.owner_task_id IS NULL AND r.settled_at < $2
			  AND r.id NOT IN (SELECT id FROM live_up)
			  AND (NOT (SELECT v FROM in_use)
			    OR (r.id <> (SELECT id FROM newest) AND r.id IS DISTINCT FROM (SELECT id FROM newest_answer)))),
		tree AS (
			SELECT r.id AS root, r.id, t.settled_at FROM roots r JOIN {schema}.tasks t ON t.id = r.id
			UNION ALL
			SELECT tr.root, c.id, c.settled_at FROM tree tr CROSS JOIN LATERAL (SELECT c.id, c.settled_at FROM {schema}.tasks c
				WHERE c.conversation_id = $1 AND c.owner_task_id = tr.id OFFSET 0) c),
		ripe AS (SELECT root FROM tree GROUP BY root HAVING bool_and(settled_at IS NOT NULL AND settled_at < $2))
		SELECT coalesce((SELECT array_agg(id) FROM (
			SELECT id FROM tree WHERE root IN (SELECT root FROM ripe) ORDER BY id DESC LIMIT $3) v), '{}'),
			coalesce((SELECT count(*) FROM ripe), 0),
			NOT (SELECT v FROM in_use)`)

	qDeleteTasks = define(`DELETE FROM {schema}.tasks WHERE conversation_id = $1 AND id = ANY($2::bigint[])`)
	// A conversation is deleted when no task is left (the guard checks it,
	// and that no live holder has it).
	qDeleteConversation = define(`DELETE FROM {schema}.conversations c WHERE c.id = $1
		AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = $1)`)
)

// MarkPrune marks tx as the prune's: the guard lets it delete what the
// delete rules allow. The mark is a row of prune_marks, which only the
// prune's role may write (migrations/sql/001_baseline.up.sql); a role
// without that grant gets ErrPermissionDenied's 42501 here. UnmarkPrune
// removes it before tx commits.
func (s *Store) MarkPrune(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, s.sql[qMarkPrune])
	return err
}

// UnmarkPrune removes tx's mark (MarkPrune), so that prune_marks holds
// only the marks of transactions still running.
func (s *Store) UnmarkPrune(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, s.sql[qUnmarkPrune])
	return err
}

// PruneCutoff returns now() minus olderThan, by the database's clock.
func (s *Store) PruneCutoff(ctx context.Context, db DB, olderThan time.Duration) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, s.sql[qPruneCutoff], micros(olderThan)).Scan(&t)
	return t, err
}

// PruneCandidate is a settled turn the prune looks at.
type PruneCandidate struct {
	ConversationID string
	SettledAt      time.Time
	ID             int64
}

// PruneCandidates returns up to limit settled turns settled before cutoff,
// after (afterAt, afterID), oldest first.
func (s *Store) PruneCandidates(ctx context.Context, db DB, cutoff, afterAt time.Time, afterID int64, limit int) ([]PruneCandidate, error) {
	rows, err := db.Query(ctx, s.sql[qPruneCandidates], cutoff, afterAt, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PruneCandidate, error) {
		var c PruneCandidate
		err := row.Scan(&c.ConversationID, &c.SettledAt, &c.ID)
		return c, err
	})
}

// EmptyConversations returns up to limit conversations created before
// cutoff that have no task, with ids after afterID, in id order.
func (s *Store) EmptyConversations(ctx context.Context, db DB, cutoff time.Time, afterID string, limit int) ([]string, error) {
	rows, err := db.Query(ctx, s.sql[qEmptyConversations], cutoff, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// LockConversationForPrune locks conv for a prune's batch, skipping it
// (ok false) when another transaction holds it or it does not exist; held
// says a live holder has its lease.
func (s *Store) LockConversationForPrune(ctx context.Context, tx pgx.Tx, conv string) (ok, held bool, err error) {
	err = tx.QueryRow(ctx, s.sql[qLockConversationForPrune], conv).Scan(&held)
	if err == pgx.ErrNoRows {
		return false, false, nil
	}
	return err == nil, held, err
}

// ConversationHeld reports whether a live holder has conv's lease (false
// for a conversation that does not exist).
func (s *Store) ConversationHeld(ctx context.Context, db DB, conv string) (bool, error) {
	var held bool
	err := db.QueryRow(ctx, s.sql[qConversationHeld], conv).Scan(&held)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	return held, err
}

// PruneVictims returns up to limit tasks of conv's ripe turns (newest id
// first), how many turns are ripe, and whether the conversation is wholly
// out of use (see qPruneVictims).
func (s *Store) PruneVictims(ctx context.Context, db DB, conv string, cutoff time.Time, limit int) (ids []int64, turns int64, whole bool, err error) {
	err = db.QueryRow(ctx, s.sql[qPruneVictims], conv, cutoff, limit).Scan(&ids, &turns, &whole)
	return ids, turns, whole, err
}

// DeleteTaskDependents deletes (or, with count, counts) the dependents'
// rows of tasks ids of conv, adding them to n by name.
func (s *Store) DeleteTaskDependents(ctx context.Context, db DB, conv string, ids []int64, count bool, n map[string]int64) error {
	for i, d := range dependents {
		if qBeforeTasks[i] >= 0 && !count {
			if _, err := db.Exec(ctx, s.sql[qBeforeTasks[i]], conv, ids); err != nil {
				return err
			}
		}
		c, err := s.execOrCount(ctx, db, count, qDeleteOfTasks[i], qCountOfTasks[i], conv, ids)
		if err != nil {
			return err
		}
		n[d.name] += c
	}
	return nil
}

// DeleteConversationDependents deletes up to limit rows of each dependent
// of conv (or, with count, counts them all), adding them to n by name, and
// reports whether any table had more than limit left.
func (s *Store) DeleteConversationDependents(ctx context.Context, db DB, conv string, limit int, count bool, n map[string]int64) (more bool, err error) {
	for i, d := range dependents {
		c, err := s.execOrCount(ctx, db, count, qDeleteOfConversation[i], qCountOfConversation[i], conv, limit)
		if err != nil {
			return false, err
		}
		n[d.name] += c
		more = more || (!count && c >= int64(limit))
	}
	return more, nil
}

func (s *Store) execOrCount(ctx context.Context, db DB, count bool, del, cnt query, args ...any) (int64, error) {
	if count {
		var c int64
		err := db.QueryRow(ctx, s.sql[cnt], args...).Scan(&c)
		return c, err
	}
	tag, err := db.Exec(ctx, s.sql[del], args...)
	return tag.RowsAffected(), err
}

// DeleteTasks deletes tasks ids of conv and returns how many.
func (s *Store) DeleteTasks(ctx context.Context, tx pgx.Tx, conv string, ids []int64) (int64, error) {
	tag, err := tx.Exec(ctx, s.sql[qDeleteTasks], conv, ids)
	return tag.RowsAffected(), err
}

// DeleteConversation deletes conv if it has no task left, and reports
// whether it did.
func (s *Store) DeleteConversation(ctx context.Context, tx pgx.Tx, conv string) (bool, error) {
	tag, err := tx.Exec(ctx, s.sql[qDeleteConversation], conv)
	return tag.RowsAffected() == 1, err
}

// PruneJobKind is the River job kind of the periodic prune (core.PruneArgs).
const PruneJobKind = publicstore.PruneJobKind

// PruneFinishedPruneJobs deletes the prune's own River jobs finished longer
// than keep ago, and returns how many.
func (s *Store) PruneFinishedPruneJobs(ctx context.Context, db DB, keep time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, s.sql[qPruneFinishedPruneJobs], micros(keep))
	return tag.RowsAffected(), err
}
