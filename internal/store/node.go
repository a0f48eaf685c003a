package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
)

// The node runner's statements: each covers every conversation (or task) of
// a batch at once.

var (
	// Conversations that have work for a node and no live holder: a pending
	// task of a known kind (found from the oldest pending tasks, through the
	// pending index: a bounded scan, whatever the number of conversations),
	// or a lease that expired with a run under it (a dead node's). Taken in
	// one statement; conversations another transaction holds are skipped.
	//
	// The oldest pending tasks are read in id order from the pending
	// index, each tested for a live holder by primary key (notHeldLive):
	// the test is a scalar subquery, which the planner cannot turn into an
	// anti-join, and whose selectivity it guesses at one half. Written as
	// NOT EXISTS, it was planned, over statistics taken while most
	// conversations were held, as a hash anti-join of every pending task
	// against every held conversation, sorted for the oldest: with a
	// backlog of 800,000 pending conversations, 1.8 s per statement
	// (TestOpenKeepsItsPlanWithABacklog). A dead holder's conversations are
	// found from the expired holders (deadHeld) and each probed for a run
	// (runsIn), for the same reason: as EXISTS, the probe was planned as a
	// scan of every task for the running ones. Both branches are bounded ($5): an
	// open takes what it finds, the next finds the rest, and the plan's
	// estimate stays small whatever the statistics say of the dead
	// holders. (Estimated at 518,000 rows, it cost 5,000,000, and
	// PostgreSQL's JIT, which compiles a plan that costs more than
	// jit_above_cost, took 569 ms of a 694 ms open.) The candidates are
	// read by primary key (a LATERAL subquery the planner cannot make a
	// join over the whole table), the free ones first (free), and only
	// those are locked, each tested again once locked; a conversation
	// another transaction holds is skipped, and the next open finds it.
	qOpenConversations = define(`WITH cand AS (
			(SELECT t.conversation_id AS id FROM {schema}.tasks t
			WHERE t.status = 'pending' AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3))
			  AND ` + notHeldLive + `
			ORDER BY t.id LIMIT $5)
			UNION
			(SELECT d.id FROM ` + deadHeld("$5") + ` LIMIT $5)),
		free AS (
			SELECT c.id FROM cand CROSS JOIN LATERAL (
				SELECT c.id, c.holder_id FROM {schema}.conversations c WHERE c.id = cand.id OFFSET 0) c
			WHERE ` + freeToTake + `
			ORDER BY c.id LIMIT $4),
		picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c
			WHERE c.id IN (SELECT id FROM free) AND ` + freeToTake + `
			ORDER BY c.id
			FOR NO KEY UPDATE OF c SKIP LOCKED)
		UPDATE {schema}.conversations c
		SET holder = $1, holder_id = $2, epoch = c.epoch + 1, updated_at = now()
		FROM picked WHERE c.id = picked.id
		RETURNING ` + openedColumns)

	// Conversations named by their notifications, taken when they have work
	// for the node and no live holder: the same test as
	// qOpenConversations's, by primary key. Every node hears every
	// notification: the first to lock a conversation takes it, the others
	// skip it. The probes are scalar subqueries by index (see
	// qOpenConversations): as EXISTS, each was planned as a scan of every
	// task, 0.3–0.9 s per statement with 800,000 pending.
	qOpenNamed = define(`WITH picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c
			WHERE c.id = ANY($5) AND ` + freeToTake + `
			  AND (coalesce((SELECT true FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'pending'
					AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3)) LIMIT 1), false)
				OR (c.holder_id IS NOT NULL AND ` + runsIn + `))
			ORDER BY c.id LIMIT $4
			FOR NO KEY UPDATE OF c SKIP LOCKED)
		UPDATE {schema}.conversations c
		SET holder = $1, holder_id = $2, epoch = c.epoch + 1, updated_at = now()
		FROM picked WHERE c.id = picked.id
		RETURNING ` + openedColumns)

	// A holder's own conversations after its fence fired (it could not
	// confirm its lease for a while, and its row has not expired): those
	// still held by it at the epochs it knows, locked in id order, skipping
	// those another transaction holds. The epoch stays: the holder's runs
	// there are recovered in the same transaction, which kills their tokens.
	qReopen = define(`WITH picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c
			JOIN unnest($2::text[], $3::bigint[]) AS v(id, epoch) ON c.id = v.id AND c.epoch = v.epoch
			WHERE c.holder_id = $1
			ORDER BY c.id
			FOR NO KEY UPDATE OF c SKIP LOCKED)
		SELECT ` + openedColumns + ` FROM picked JOIN {schema}.conversations c ON c.id = picked.id ORDER BY c.id`)

	// How many conversations an open would find (at most $2): a full node
	// releases idle conversations for room only when there is something to
	// open. $3 names the conversations to look at (null: scan as
	// qOpenConversations does, the $4 oldest pending tasks). The
	// candidates are found first, each branch through its index, and each
	// conversation is then read by primary key: a test of every
	// conversation OR'ed across the branches was planned as a scan of the
	// whole table.
	qCountOpenable = define(`SELECT count(*) FROM (
			SELECT 1 FROM (
				(SELECT t.conversation_id AS id FROM {schema}.tasks t
				WHERE $3::text[] IS NULL AND t.status = 'pending' AND NOT t.abort_requested
				  AND ($1::text[] IS NULL OR t.kind = ANY($1)) AND ` + notHeldLive + `
				ORDER BY t.id LIMIT $4)
				UNION
				(SELECT d.id FROM ` + deadHeld("$4") + ` AND $3::text[] IS NULL LIMIT $4)
				UNION
				SELECT unnest($3::text[])) cand
			CROSS JOIN LATERAL (
				SELECT c.* FROM {schema}.conversations c WHERE c.id = cand.id OFFSET 0) c
			WHERE ` + freeToTake + `
			  AND ($3::text[] IS NULL
				OR coalesce((SELECT true FROM {schema}.tasks t WHERE t.conversation_id = c.id
					AND t.status = 'pending' AND NOT t.abort_requested AND ($1::text[] IS NULL OR t.kind = ANY($1)) LIMIT 1), false)
				OR (c.holder_id IS NOT NULL AND ` + runsIn + `))
			LIMIT $2) x`)

	qRunningIn = define(`SELECT {task_columns} FROM {schema}.tasks
		WHERE conversation_id = ANY($1) AND status = 'running' ORDER BY id`)

	// Waits and completing tasks that recovery must repair: a waiting task
	// whose wait is satisfied, a completing task with no live foreground
	// child. Only what was written behind the engine's back has any.
	qToRepair = define(`SELECT w.id, w.status FROM {schema}.tasks w
		WHERE w.conversation_id = ANY($1) AND (
			(w.status = 'waiting' AND (
				NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = w.id AND c.id = ANY(w.wait_ids) AND c.status IN ({live}))
				OR (w.wait_policy = 'fail_fast' AND EXISTS (SELECT 1 FROM {schema}.tasks c
					WHERE c.owner_task_id = w.id AND c.id = ANY(w.wait_ids) AND c.status IN ('failed', 'aborted', 'cancelled', 'orphaned')))))
			OR (w.status = 'completing' AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c
				WHERE c.owner_task_id = w.id AND NOT c.background AND c.status IN ({live}))))
		ORDER BY w.id DESC`)

	// Idle conversations released together: only those still held at the
	// epochs given with nothing running (a release with a run goes through
	// the one-by-one path, which recovers it).
	qReleaseIdle = define(`WITH locked AS (
			SELECT c.id FROM {schema}.conversations c
			JOIN unnest($1::text[], $2::bigint[]) AS v(id, epoch) ON c.id = v.id AND c.epoch = v.epoch
			WHERE c.holder_id = $3
			ORDER BY c.id FOR NO KEY UPDATE OF c SKIP LOCKED)
		UPDATE {schema}.conversations c
		SET holder = NULL, holder_id = NULL, updated_at = now()
		FROM locked WHERE c.id = locked.id AND NOT ` + runsIn + `
		RETURNING c.id`)

	// The transaction's id, for resolving a commit whose outcome is unknown.
	qXactID = define(`SELECT pg_current_xact_id()::text::bigint`)

	// What became of a transaction: committed, aborted, in progress (null:
	// too old to know).
	qXactStatus = define(`SELECT coalesce(pg_xact_status($1::bigint::text::xid8), '')`)

	// The conversations among $1 held by $2 that have a pending task
	// (work), and among them those that no other transaction holds, locked
	// in id order (conversation rows first, as every transaction takes
	// them; exclusively, as every writer of a conversation's log holds
	// it): a claim in them then cannot skip their rows. One with no
	// pending task has nothing for a claim, and is not locked. The check
	// and the locks share the statement's snapshot. The check is a lateral
	// subquery, run per conversation by the index of its live tasks (as an
	// EXISTS, the plan may hash every pending task of the table instead).
	// Its status and holder tests are the claim's (see claimSQL): only the
	// live index and the primary key serve them, whatever the statistics
	// (the holder's index would read every conversation the node holds).
	qLockHeld = define(`WITH work AS MATERIALIZED (
			SELECT c.id FROM {schema}.conversations c
			CROSS JOIN LATERAL (SELECT 1 FROM {schema}.tasks t
				WHERE t.conversation_id = c.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
				  AND NOT t.abort_requested LIMIT 1) p
			WHERE c.id = ANY($1) AND c.holder_id IS NOT DISTINCT FROM $2::bigint),
		locked AS MATERIALIZED (
			SELECT c.id FROM {schema}.conversations c
			WHERE c.id = ANY(ARRAY(SELECT id FROM work)) AND c.holder_id IS NOT DISTINCT FROM $2::bigint
			ORDER BY c.id FOR NO KEY UPDATE SKIP LOCKED)
		SELECT ARRAY(SELECT id FROM work ORDER BY id), ARRAY(SELECT id FROM locked ORDER BY id)`)

	// The conversations a holder row holds.
	qHeldBy = define(`SELECT id, epoch FROM {schema}.conversations
		WHERE holder_id = $1 ORDER BY id`)
)

// deadHeld lists, as d.id, the conversations of expired holders with a
// run under them: read from each expired holder (the holders table holds a
// row per node's life), its conversations through the holder index, at
// most limit of them per holder (a LATERAL subquery with a LIMIT, which
// the planner cannot turn into a join over the whole table). Written as a
// join of the holders to the conversations, PostgreSQL 17 and 18 planned
// the UNION it is a branch of as an ordered merge, and this branch as a
// scan of every conversation in key order, each tested for its holder: an
// open over a backlog of 20,000 did 27,100 rows of work (6,702 on 15),
// 447 ms against 30 ms (TestOpenKeepsItsPlanWithABacklog, issue 38). Its
// callers add to the WHERE clause and bound the whole.
func deadHeld(limit string) string {
	return `{schema}.holders hx CROSS JOIN LATERAL (
			SELECT c.id FROM {schema}.conversations c
			WHERE c.holder_id = hx.id AND ` + runsIn + ` LIMIT ` + limit + `) d
		WHERE hx.expires_at < now()`
}

// openedColumns are what an open returns of each conversation it took: its
// id and new epoch, the transaction's id, and whether recovery has
// anything to look at (a task running under a former holder, a wait or a
// completing task that might need repair); a conversation with none of
// them needs no reconcile_on_open. The probe is a scalar subquery through
// the live index by conversation (see notHeldLive): as EXISTS it was
// planned as a scan of every task.
const openedColumns = `c.id, c.epoch, pg_current_xact_id()::text::bigint,
		coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status IN ('running', 'waiting', 'completing') LIMIT 1), false),
		picked.prev_holder, picked.prev_restarted`

// OpenedLease is a conversation a node took: its id and new epoch, the
// opening transaction's id, whether it needs recovery, and what the
// take-over found of the holder before it (see Taken).
type OpenedLease struct {
	ConversationID string
	Epoch          int64
	Xact           int64
	Recover        bool
	PrevHolder     int64
	PrevRestarted  bool
}

// OpenConversations gives holder (its name and row) up to limit
// conversations that have work for kinds (nil: any kind) and no live
// holder; scan bounds how many of the oldest pending tasks are looked at to
// find them. Their rows stay locked until the transaction ends.
func (s *Store) OpenConversations(ctx context.Context, db DB, holder string, holderID int64, kinds []string, limit, scan int) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qOpenConversations], holder, holderID, kinds, limit, scan))
}

// Reopen locks, in id order, the conversations among ids (at the epochs
// given, same index) that holder row holderID still holds and no other
// transaction holds, and returns them as an open would (their epochs
// unchanged). Their rows stay locked until the transaction ends.
func (s *Store) Reopen(ctx context.Context, db DB, holderID int64, ids []string, epochs []int64) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qReopen], holderID, ids, epochs))
}

// CountOpenable says how many conversations (at most limit) an open for
// kinds would find among named (nil: by a scan of the oldest scan pending
// tasks).
func (s *Store) CountOpenable(ctx context.Context, db DB, kinds []string, limit int, named []string, scan int) (int, error) {
	var n int
	err := db.QueryRow(ctx, s.sql[qCountOpenable], kinds, limit, named, scan).Scan(&n)
	return n, err
}

// OpenNamed is OpenConversations among the conversations ids only.
func (s *Store) OpenNamed(ctx context.Context, db DB, holder string, holderID int64, kinds []string, limit int, ids []string) ([]OpenedLease, error) {
	return collectOpened(db.Query(ctx, s.sql[qOpenNamed], holder, holderID, kinds, limit, ids))
}

func collectOpened(rows pgx.Rows, err error) ([]OpenedLease, error) {
	if err != nil {
		return nil, err
	}
	// openedColumns are OpenedLease's fields, in its order.
	return pgx.CollectRows(rows, pgx.RowToStructByPos[OpenedLease])
}

// RunningIn reads the running tasks of the conversations, in id order.
func (s *Store) RunningIn(ctx context.Context, db DB, convs []string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qRunningIn], convs))
}

// ToRepair lists the waiting tasks with satisfied waits and the completing
// tasks with no live foreground child in the conversations, deepest first.
func (s *Store) ToRepair(ctx context.Context, db DB, convs []string) (ids []int64, statuses []arbortype.Status, err error) {
	rows, err := db.Query(ctx, s.sql[qToRepair], convs)
	if err != nil {
		return nil, nil, err
	}
	var (
		id int64
		st string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error {
		ids, statuses = append(ids, id), append(statuses, arbortype.Status(st))
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return ids, statuses, nil
}

// ReleaseIdle frees the conversations holder holds at the epochs given
// (same index) that have no running task, and returns those it freed.
func (s *Store) ReleaseIdle(ctx context.Context, db DB, holder int64, ids []string, epochs []int64) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qReleaseIdle], ids, epochs, holder))
}

// LockHeld locks, in id order, the conversations among ids that holder
// holds, that have a pending task, and that no other transaction holds.
// It returns those with a pending task (work) and, of them, those it
// locked.
func (s *Store) LockHeld(ctx context.Context, db DB, ids []string, holder int64) (work, locked []string, err error) {
	// Two arrays in one row: a join of the two sets, planned over
	// statistics that expect none of them, compared every one with every
	// other.
	err = db.QueryRow(ctx, s.sql[qLockHeld], ids, holder).Scan(&work, &locked)
	return work, locked, err
}

// XactID returns the id of db's transaction (assigning one).
func (s *Store) XactID(ctx context.Context, db DB) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, s.sql[qXactID]).Scan(&id)
	return id, err
}

// XactStatus says what became of transaction xact: "committed",
// "aborted", "in progress", "" when it is too old to know, or "future"
// when the server never gave the id out (pg_xact_status refuses an id past
// the server's next one with 22023, its only refusal of a valid id: the
// server is not the one the transaction ran on, but a standby promoted
// before the transaction's records reached it).
func (s *Store) XactStatus(ctx context.Context, db DB, xact int64) (string, error) {
	var st string
	err := db.QueryRow(ctx, s.sql[qXactStatus], xact).Scan(&st)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22023" {
		return "future", nil
	}
	return st, err
}

// HeldBy lists the conversations holder row holder holds.
func (s *Store) HeldBy(ctx context.Context, db DB, holder int64) ([]OpenedLease, error) {
	rows, err := db.Query(ctx, s.sql[qHeldBy], holder)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OpenedLease, error) {
		var l OpenedLease
		err := row.Scan(&l.ConversationID, &l.Epoch)
		return l, err
	})
}
