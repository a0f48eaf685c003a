package store

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// The node runner's statements: each covers every conversation (or task) of
// a batch at once.

// genRule is the generation rule as SQL, for a pending task t: children,
// and roots that are not generations (kinds outside $gen, when $gen is not
// null), start freely; a root that is a generation starts if it is under way
// already (started before: woken or requeued), or if no other live
// generation of its conversation is under way or older. At most one live
// generation of a conversation runs at a time, oldest first.
const genRule = `(t.owner_task_id IS NOT NULL
		OR ($gen::text[] IS NOT NULL AND NOT (t.kind = ANY($gen::text[])))
		OR t.started_at IS NOT NULL
		OR NOT EXISTS (SELECT 1 FROM {schema}.tasks r
			WHERE r.conversation_id = t.conversation_id AND r.owner_task_id IS NULL AND r.id <> t.id
			  AND r.status IN ({live})
			  AND ($gen::text[] IS NULL OR r.kind = ANY($gen::text[]))
			  AND (r.started_at IS NOT NULL OR r.id < t.id)))`

var (
	// Conversations that have work for a node and no live holder: a pending
	// task of a known kind (found from the oldest pending tasks, through the
	// pending index: a bounded scan, whatever the number of conversations),
	// or a lease that expired with a run under it (a dead node's). Taken in
	// one statement; conversations another transaction holds are skipped.
	qOpenConversations = define(`WITH cand AS (
			(SELECT t.conversation_id AS id FROM {schema}.tasks t
			WHERE t.status = 'pending' AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3))
			  AND NOT EXISTS (SELECT 1 FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = h.holder_id
				WHERE h.id = t.conversation_id AND hh.expires_at >= now())
			ORDER BY t.id LIMIT $5)
			UNION
			SELECT c.id FROM {schema}.holders hx JOIN {schema}.conversations c ON c.holder_id = hx.id
			WHERE hx.expires_at < now()
			  AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'running')),
		picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c WHERE c.id IN (SELECT id FROM cand)
			  AND ` + freeToTake + `
			ORDER BY c.id LIMIT $4
			FOR NO KEY UPDATE OF c SKIP LOCKED)
		UPDATE {schema}.conversations c
		SET holder = $1, holder_id = $2, epoch = c.epoch + 1, updated_at = now()
		FROM picked WHERE c.id = picked.id
		RETURNING ` + openedColumns)

	// Conversations named by their notifications, taken when they have work
	// for the node and no live holder: the same test as
	// qOpenConversations's, by primary key. Every node hears every
	// notification: the first to lock a conversation takes it, the others
	// skip it.
	qOpenNamed = define(`WITH picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c
			WHERE c.id = ANY($5) AND ` + freeToTake + `
			  AND (EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'pending'
					AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3)))
				OR (c.holder_id IS NOT NULL AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'running')))
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
	// qOpenConversations does, the $4 oldest pending tasks).
	qCountOpenable = define(`SELECT count(*) FROM (
			SELECT c.id FROM {schema}.conversations c
			WHERE ` + freeToTake + `
			  AND ($3::text[] IS NULL OR c.id = ANY($3))
			  AND (($3::text[] IS NULL AND c.id IN (
					SELECT t.conversation_id FROM {schema}.tasks t
					WHERE t.status = 'pending' AND NOT t.abort_requested AND ($1::text[] IS NULL OR t.kind = ANY($1))
					  AND NOT EXISTS (SELECT 1 FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = h.holder_id
						WHERE h.id = t.conversation_id AND hh.expires_at >= now())
					ORDER BY t.id LIMIT $4))
				OR ($3::text[] IS NOT NULL AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id
					AND t.status = 'pending' AND NOT t.abort_requested AND ($1::text[] IS NULL OR t.kind = ANY($1))))
				OR (c.holder_id IS NOT NULL AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'running')))
			LIMIT $2) x`)

	// The claims of a node: in the conversations given ($2), or in all it
	// holds. Two stages, so that the plan does not depend on statistics:
	// the candidates are found from the conversations (by the index of
	// each conversation's live tasks, or of the holder's conversations),
	// the generation rule applied, oldest first; then each is locked, with
	// its conversation share-locked as held by $1, both skipping rows
	// another transaction holds, and checked again as locked.
	qClaimIn   = define(claimSQL(`SELECT DISTINCT unnest($2::text[]) AS id`))
	qClaimHeld = define(claimSQL(`SELECT c.id FROM {schema}.conversations c WHERE c.holder_id = $1 AND $2::text[] IS NULL`))

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
		FROM locked WHERE c.id = locked.id
		  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status = 'running')
		RETURNING c.id`)

	// A flush's conversations, locked in id order, skipping those another
	// transaction holds (their outcomes go in a later flush: a conversation
	// locked elsewhere delays only its own); held says whether this node
	// still holds each (the flush claims only in those).
	qLockForFlush = define(`SELECT id, coalesce(holder_id = $2, false), pg_current_xact_id()::text::bigint FROM {schema}.conversations
		WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED`)

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

	// Completions that need nothing else: running under the run's token, not
	// being aborted, with no live foreground child. The others are applied
	// one by one. The statements of a flush that take tasks by id test the
	// status with IS NOT DISTINCT FROM, which no index serves, so that
	// statistics over a settled history (none running, waiting or
	// completing) cannot plan a scan of a live-status index per row instead
	// of the primary key (TestFlushKeepsItsPlansAfterASettledHistory).
	qCompleteMany = define(logged(`WITH v AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS v(id, token, result))
		UPDATE {schema}.tasks t
		SET status = $4, result = v.result::jsonb,
		    settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		FROM v
		WHERE t.id = v.id AND t.token = v.token AND t.status IS NOT DISTINCT FROM 'running' AND NOT t.abort_requested
		  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = t.id AND NOT c.background AND c.status IN ({live}))`,
		"t", "id, coalesce(owner_task_id, 0)", ""))

	// Owners whose waits the settles satisfied: no waited child is live. (A
	// fail_fast wait tripped by a child that did not complete is applied by
	// that child's own settle, one by one.)
	qWakeSatisfied = define(logged(`UPDATE {schema}.tasks o SET status = $2, updated_at = now()
		WHERE o.id = ANY($1) AND o.status IS NOT DISTINCT FROM 'waiting'
		  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = o.id AND c.id = ANY(o.wait_ids) AND c.status IN ({live}))`,
		"o", "id", ""))

	// Completing owners whose last live foreground child settled.
	qCompleteHeld = define(logged(`UPDATE {schema}.tasks o
		SET status = $2, settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass), updated_at = now()
		WHERE o.id = ANY($1) AND o.status IS NOT DISTINCT FROM 'completing'
		  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = o.id AND NOT c.background AND c.status IN ({live}))`,
		"o", "id, coalesce(owner_task_id, 0)", ""))

	// The tasks of a batch's waits, locked, with what a wait checks.
	qLockRunStates = define(`SELECT id, status, coalesce(token, 0), abort_requested FROM {schema}.tasks
		WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED`)

	qChildStates = define(`SELECT id, coalesce(owner_task_id, 0), status, coalesce(settle_seq, 0) FROM {schema}.tasks
		WHERE id = ANY($1)`)

	// Waits parked together: running → waiting with phase, state, policy
	// and ids (as text, one array per row).
	qWaitMany = define(logged(`UPDATE {schema}.tasks t
		SET status = $6, phase = v.phase, state = v.state::jsonb, wait_policy = v.policy, wait_ids = v.ids::bigint[],
		    token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS v(id, phase, state, policy, ids)
		WHERE t.id = v.id`, "t", "count(*)", ""))

	qWakeMany = define(logged(`UPDATE {schema}.tasks t SET status = $2, updated_at = now() WHERE id = ANY($1)`, "t", "count(*)", ""))
)

// claimSQL is a node's claim in the conversations convs selects (see
// qClaimIn). Its shape fixes the plan: each conversation's pending tasks
// are read by the index of its live tasks (a lateral subquery, run per
// conversation), and the candidates are then locked by primary key.
//
// The status and holder tests are written so that no other index can
// serve them, whatever the statistics say: statistics over a settled
// history (nothing pending, no conversation held, analyzed between runs)
// planned the lateral as a scan of the whole pending index per
// conversation, and the lock as a scan of every pending task joined to
// every conversation of the holder — pending × held rows per claim (bench
// (l): 415 µs of server CPU per task after 30,000 settled tasks, 2,546
// after 1,000,000, against 88 fresh). "status IN ({live}) AND status IS
// NOT DISTINCT FROM 'pending'" is status = 'pending' (status is never
// NULL) that proves the live index's predicate but not the pending
// index's; IS NOT DISTINCT FROM no index serves, and the holder is never
// NULL on the side of $1. TestClaimKeepsItsPlanAfterASettledHistory
// keeps it so.
//
// A claim is refused by the database once its holder's row has expired
// (the fence on the node's own clock stops it first; this is for the
// claim sent by a process resumed from a freeze before its fence fired,
// whose run the taker would have counted as a restart).
func claimSQL(convs string) string {
	return expand(logged(`WITH cand AS MATERIALIZED (
			SELECT t.id FROM (`+convs+`) cv
			CROSS JOIN LATERAL (
				SELECT t.id FROM {schema}.tasks t
				WHERE t.conversation_id = cv.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
				  AND NOT t.abort_requested
				  AND ($3::text[] IS NULL OR t.kind = ANY($3))
				  AND `+genRule+`
				ORDER BY t.id LIMIT $5) t
			ORDER BY t.id LIMIT $5),
		picked AS (
			SELECT t.id AS picked_id, c.epoch AS picked_epoch FROM {schema}.tasks t
			JOIN {schema}.conversations c ON c.id = t.conversation_id
			WHERE t.id = ANY(ARRAY(SELECT id FROM cand))
			  AND t.status IS NOT DISTINCT FROM 'pending' AND NOT t.abort_requested
			  AND c.holder_id IS NOT DISTINCT FROM $1::bigint
			  AND EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = $1::bigint AND h.expires_at > now())
			FOR NO KEY UPDATE OF t, c SKIP LOCKED)
		UPDATE {schema}.tasks t SET `+claimSet+`
		FROM picked WHERE t.id = picked.picked_id`, "t", "{run_columns}, pg_current_xact_id()::text::bigint", "ORDER BY id"), "$gen", "$4", "$status", "$6", "$epoch", "picked.picked_epoch", "$lease", "$7")
}

// openedColumns are what an open returns of each conversation it took: its
// id and new epoch, the transaction's id, and whether recovery has
// anything to look at (a task running under a former holder, a wait or a
// completing task that might need repair); a conversation with none of
// them needs no reconcile_on_open.
const openedColumns = `c.id, c.epoch, pg_current_xact_id()::text::bigint,
		EXISTS (SELECT 1 FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status IN ('running', 'waiting', 'completing')),
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
	defer rows.Close()
	var out []OpenedLease
	for rows.Next() {
		var l OpenedLease
		if err := rows.Scan(&l.ConversationID, &l.Epoch, &l.Xact, &l.Recover, &l.PrevHolder, &l.PrevRestarted); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// ClaimIn starts up to limit pending tasks of the conversations convs that
// holder holds, of kinds (nil: any), by the generation rule for generation
// kinds gen (nil: every root is a generation), oldest first, each with its
// own token and the conversation's epoch. It returns the runs' rows (the
// run columns), in no particular order, and the transaction's id (0 when
// it claimed nothing).
func (s *Store) ClaimIn(ctx context.Context, db DB, holder int64, convs, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration) ([]arbortype.Task, int64, error) {
	if convs == nil {
		convs = []string{}
	}
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimIn], holder, convs, kinds, gen, limit, string(status), micros(lease)))
}

// ClaimHeld is ClaimIn across every conversation holder holds.
func (s *Store) ClaimHeld(ctx context.Context, db DB, holder int64, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration) ([]arbortype.Task, int64, error) {
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimHeld], holder, nil, kinds, gen, limit, string(status), micros(lease)))
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
	defer rows.Close()
	for rows.Next() {
		var (
			id int64
			st string
		)
		if err := rows.Scan(&id, &st); err != nil {
			return nil, nil, err
		}
		ids, statuses = append(ids, id), append(statuses, arbortype.Status(st))
	}
	return ids, statuses, rows.Err()
}

// ReleaseIdle frees the conversations holder holds at the epochs given
// (same index) that have no running task, and returns those it freed.
func (s *Store) ReleaseIdle(ctx context.Context, db DB, holder int64, ids []string, epochs []int64) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qReleaseIdle], ids, epochs, holder))
}

// LockForFlush locks the conversations in id order, skipping those another
// transaction holds (missing from held), and says which holder row holder
// still holds; xact is the transaction's id (0 when it locked none).
func (s *Store) LockForFlush(ctx context.Context, db DB, ids []string, holder int64) (held map[string]bool, xact int64, err error) {
	rows, err := db.Query(ctx, s.sql[qLockForFlush], ids, holder)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	held = make(map[string]bool, len(ids))
	for rows.Next() {
		var (
			id string
			h  bool
		)
		if err := rows.Scan(&id, &h, &xact); err != nil {
			return nil, 0, err
		}
		held[id] = h
	}
	return held, xact, rows.Err()
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
// "aborted", "in progress", or "" when it is too old to know.
func (s *Store) XactStatus(ctx context.Context, db DB, xact int64) (string, error) {
	var st string
	err := db.QueryRow(ctx, s.sql[qXactStatus], xact).Scan(&st)
	return st, err
}

// HeldBy lists the conversations holder row holder holds.
func (s *Store) HeldBy(ctx context.Context, db DB, holder int64) ([]OpenedLease, error) {
	rows, err := db.Query(ctx, s.sql[qHeldBy], holder)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OpenedLease
	for rows.Next() {
		var l OpenedLease
		if err := rows.Scan(&l.ConversationID, &l.Epoch); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// Settled is a task a set-based statement settled: its id and its owner's.
type Settled struct {
	ID, OwnerID int64
}

func collectSettled(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}, err error) ([]Settled, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Settled
	for rows.Next() {
		var s Settled
		if err := rows.Scan(&s.ID, &s.OwnerID); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// CompleteMany settles as `to` (completed) the running tasks among ids held
// with the token at the same index, not being aborted and with no live
// foreground child, recording the result at the same index; it returns
// those it settled.
func (s *Store) CompleteMany(ctx context.Context, db DB, ids, tokens []int64, results []*string, to arbortype.Status) ([]Settled, error) {
	rows, err := db.Query(ctx, s.sql[qCompleteMany], ids, tokens, results, string(to))
	return collectSettled(rows, err)
}

// WakeSatisfied wakes (`to`, pending) the waiting tasks among ids whose
// waited children are all settled, and returns them.
func (s *Store) WakeSatisfied(ctx context.Context, db DB, ids []int64, to arbortype.Status) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qWakeSatisfied], ids, string(to)))
}

// CompleteHeld completes (`to`) the completing tasks among ids with no live
// foreground child, and returns them.
func (s *Store) CompleteHeld(ctx context.Context, db DB, ids []int64, to arbortype.Status) ([]Settled, error) {
	rows, err := db.Query(ctx, s.sql[qCompleteHeld], ids, string(to))
	return collectSettled(rows, err)
}

// LockRunStates locks the tasks among ids in id order and reads what a
// fenced write checks of them.
func (s *Store) LockRunStates(ctx context.Context, db DB, ids []int64) ([]OwnerState, error) {
	rows, err := db.Query(ctx, s.sql[qLockRunStates], ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OwnerState
	for rows.Next() {
		var (
			o  OwnerState
			st string
		)
		if err := rows.Scan(&o.ID, &st, &o.Token, &o.AbortRequested); err != nil {
			return nil, err
		}
		o.Status = arbortype.Status(st)
		out = append(out, o)
	}
	return out, rows.Err()
}

// ChildState is what a wait checks of a waited child.
type ChildState struct {
	ID, OwnerID int64
	Status      arbortype.Status
	SettleSeq   int64
}

// ChildStates reads the tasks among ids (missing ones are left out).
func (s *Store) ChildStates(ctx context.Context, db DB, ids []int64) ([]ChildState, error) {
	rows, err := db.Query(ctx, s.sql[qChildStates], ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ChildState
	for rows.Next() {
		var (
			c  ChildState
			st string
		)
		if err := rows.Scan(&c.ID, &c.OwnerID, &st, &c.SettleSeq); err != nil {
			return nil, err
		}
		c.Status = arbortype.Status(st)
		out = append(out, c)
	}
	return out, rows.Err()
}

// WaitParked is one wait WaitMany parks.
type WaitParked struct {
	ID     int64
	Phase  string
	State  json.RawMessage
	Policy arbortype.WaitPolicy
	IDs    []int64
}

// WaitMany parks running tasks on their children (`to`, waiting) in one
// statement; the caller has locked and checked them.
func (s *Store) WaitMany(ctx context.Context, db DB, ws []WaitParked, to arbortype.Status) error {
	n := len(ws)
	ids, phases, states, policies, lists := make([]int64, n), make([]string, n), make([]*string, n), make([]string, n), make([]string, n)
	for i, w := range ws {
		ids[i], phases[i], policies[i] = w.ID, w.Phase, string(w.Policy)
		if len(w.State) > 0 {
			st := string(w.State)
			states[i] = &st
		}
		lists[i] = int64Array(w.IDs)
	}
	_, err := db.Exec(ctx, s.sql[qWaitMany], ids, phases, states, policies, lists, string(to))
	return err
}

// WakeMany moves the tasks among ids (waiting, just parked) to `to`
// (pending).
func (s *Store) WakeMany(ctx context.Context, db DB, ids []int64, to arbortype.Status) error {
	_, err := db.Exec(ctx, s.sql[qWakeMany], ids, string(to))
	return err
}

// int64Array writes ids as a PostgreSQL array literal.
func int64Array(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, '}'))
}
