package store

import (
	publicstore "github.com/arborhq/arbor/store"

	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention: the prune's statements (docs/operations.md, "Retention").
//
// The prune deletes settled turns (a root task with its whole subtree) and
// whole conversations. Its transactions are marked (MarkPrune), without
// which the guards refuse every delete of a task, a conversation or a row
// of theirs; the guard also
// checks every deleted task semantically (guardrules.DeleteRules), whatever the
// statement that deletes it.

// dependent is a table whose rows belong to tasks, or to a conversation,
// and go with them, deleted before the tasks they refer to. Its statements
// in store/queries/retention.sql are named after it: Delete…OfTasks and
// Count…OfTasks select the rows of tasks $2 (bigint[]) of conversation $1,
// Delete…OfConversation and Count…OfConversation a bounded batch ($2) of
// every row of conversation $1.
type dependent struct {
	// name is how a summary counts the table's rows, and (in CamelCase)
	// the middle of its statements' names.
	name string
	// carry says that Carry…BeforeTasks runs (conversation $1, tasks $2)
	// before the rows of pruned tasks are deleted: what must outlive them.
	carry bool
}

// dependents are what a pruned task or conversation takes with it. A
// table that refers to tasks or conversations is one more line here, and
// its four statements in retention.sql.
var dependents = []dependent{
	// A pruned task's budgets go with it; its reservations too, their spend
	// carried into the conversation's budgets (a session's spend outlives
	// its pruned turns; an open one is spent in full, its run long over).
	{name: "budgets"},
	{name: "budget_reservations", carry: true},
	{name: "events"},
	{name: "log_entries"},
	// Wake jobs are found through River's GIN index on args, one task at a
	// time; a running one (its worker holds it) is left to River.
	{name: "wake_jobs"},
}

// camel is a dependent's name as the middle of its statements' names
// (log_entries: LogEntries).
func camel(name string) string {
	var b strings.Builder
	for _, w := range strings.Split(name, "_") {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
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
			if d.carry {
				q = define("Carry" + camel(d.name) + "BeforeTasks")
			}
			before = append(before, q)
		}
		return
	}()
	qDeleteOfTasks, qCountOfTasks, qDeleteOfConversation, qCountOfConversation = func() (del, cnt, delConv, cntConv []query) {
		for _, d := range dependents {
			del = append(del, define("Delete"+camel(d.name)+"OfTasks"))
			cnt = append(cnt, define("Count"+camel(d.name)+"OfTasks"))
			delConv = append(delConv, define("Delete"+camel(d.name)+"OfConversation"))
			cntConv = append(cntConv, define("Count"+camel(d.name)+"OfConversation"))
		}
		return
	}()

	qPruneFinishedPruneJobs   = define("PruneFinishedPruneJobs")
	qMarkPrune                = define("MarkPrune")
	qUnmarkPrune              = define("UnmarkPrune")
	qPruneCutoff              = define("PruneCutoff")
	qPruneCandidates          = define("PruneCandidates")
	qEmptyConversations       = define("EmptyConversations")
	qLockConversationForPrune = define("LockConversationForPrune")
	qConversationHeld         = define("ConversationHeld")
	qPruneVictims             = define("PruneVictims")
	qDeleteTasks              = define("DeleteTasks")
	qDeleteConversation       = define("DeleteConversation")
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
