package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	qConversationIDs     = define(`SELECT id FROM {schema}.conversations ORDER BY id`)
	qDuplicateLiveTokens = define(`SELECT token FROM {schema}.tasks
		WHERE conversation_id = $1 AND token IS NOT NULL GROUP BY token HAVING count(*) > 1`)

	// What the checker reads of the rows beside the tasks (docs/design.md
	// §4, invariants 8, 11 and 12): rows a guard refuses to write, which
	// only a write with the triggers off (or a bug of the guard) leaves.

	// The conversation's holder as its row names it, the holders row it
	// points at with its deadline, and the database's clock.
	qCheckHolder = define(`SELECT coalesce(c.holder, ''), coalesce(c.holder_id, 0), h.name, h.expires_at, statement_timestamp(), c.created_at
		FROM {schema}.conversations c LEFT JOIN {schema}.holders h ON h.id = c.holder_id
		WHERE c.id = $1`)
	// Tasks whose delivered is not what an await's wake writes: nothing,
	// a bare timeout, or an event of the conversation delivered to the
	// task, with its payload as emitted (fsm's deliveredRule, read).
	qForgedDeliveries = define(`SELECT t.id FROM {schema}.tasks t
		WHERE t.conversation_id = $1 AND t.delivered IS NOT NULL
		  AND NOT ((coalesce(t.delivered->>'timed_out', '') = 'true' AND NOT (t.delivered ? 'event_id') AND NOT (t.delivered ? 'payload'))
			OR CASE WHEN t.delivered->>'event_id' ~ '^[0-9]{1,18}$' THEN EXISTS (SELECT 1 FROM {schema}.events ev
				WHERE ev.conversation_id = t.conversation_id AND ev.id = (t.delivered->>'event_id')::bigint
				  AND ev.delivered_to = t.id AND ev.payload IS NOT DISTINCT FROM t.delivered->'payload') ELSE false END)
		ORDER BY t.id`)
	// Live tasks that claim to be a fork's copies (a fork copies settled
	// tasks only).
	qLiveForks = define(`SELECT id FROM {schema}.tasks
		WHERE conversation_id = $1 AND forked_from IS NOT NULL AND status IN ({live}) ORDER BY id`)
	qAllEvents = define(`SELECT ` + eventColumns + ` FROM {schema}.events WHERE conversation_id = $1 ORDER BY id`)
	// Per task the log names: its newest status entry, and the names it
	// was logged parked awaiting.
	qLogByTask = define(`SELECT task_id,
			coalesce((array_agg(status ORDER BY seq DESC) FILTER (WHERE kind = 'status'))[1], ''),
			coalesce(array_agg(DISTINCT payload->>'await') FILTER (WHERE kind = 'status' AND status = 'sleeping' AND payload ? 'await'), '{}')
		FROM {schema}.conversation_log WHERE conversation_id = $1 AND task_id IS NOT NULL
		GROUP BY task_id ORDER BY task_id`)
	// Rows that name a conversation that does not exist (a foreign key
	// the triggers' being off let through; the log has none), by table
	// and conversation.
	qOrphanRows = define(`SELECT tbl, conversation_id, n FROM (
			SELECT 'tasks' AS tbl, conversation_id, count(*) AS n FROM {schema}.tasks GROUP BY conversation_id
			UNION ALL SELECT 'events', conversation_id, count(*) FROM {schema}.events GROUP BY conversation_id
			UNION ALL SELECT 'conversation_log', conversation_id, count(*) FROM {schema}.conversation_log GROUP BY conversation_id
			UNION ALL SELECT 'budgets', conversation_id, count(*) FROM {schema}.budgets GROUP BY conversation_id
			UNION ALL SELECT 'budget_reservations', conversation_id, count(*) FROM {schema}.budget_reservations GROUP BY conversation_id) r
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.id = r.conversation_id)
		ORDER BY conversation_id, tbl LIMIT $1`)
	// Log entries stamped more than $2 microseconds after the database's
	// clock (the first ten).
	qFutureLog = define(`SELECT seq FROM {schema}.conversation_log
		WHERE conversation_id = $1 AND at > statement_timestamp() + $2 * interval '1 microsecond' ORDER BY seq LIMIT 10`)
	// Event entries of the log that no emit wrote (the first ten): one
	// without the event's id (every emit's entry names it); one whose id
	// names no event of the conversation that matches it in name, task
	// and payload, when an event with that id exists (in the conversation
	// but differing, or in another conversation: a fork maps the ids it
	// copies and writes null for the others) or the id was never given
	// out (past the events' sequence, read only where the checker's role
	// may read it). An id given out whose event is gone is not reported:
	// the prune deletes an event with the turn it was delivered to, and
	// may keep its entry (one addressed to no task). A fork's copy of an
	// entry whose event it did not copy names none (null), which is not
	// reported either.
	qForgedLogEvents = define(`WITH seq AS (SELECT pg_get_serial_sequence('{schema}.events', 'id')::regclass AS s),
			issued AS (SELECT CASE WHEN has_sequence_privilege(s, 'SELECT,USAGE') THEN pg_sequence_last_value(s) END AS last FROM seq)
		SELECT l.seq FROM {schema}.conversation_log l
		WHERE l.conversation_id = $1 AND l.kind = 'event'
		  AND CASE WHEN l.payload IS NULL OR jsonb_typeof(l.payload) <> 'object' OR NOT l.payload ? 'event_id' THEN true
			WHEN l.payload->>'event_id' ~ '^[0-9]{1,18}$' THEN NOT EXISTS (SELECT 1 FROM {schema}.events ev
				WHERE ev.conversation_id = $1 AND ev.id = (l.payload->>'event_id')::bigint
				  AND ev.name IS NOT DISTINCT FROM l.name
				  AND (ev.task_id IS NOT DISTINCT FROM l.task_id OR l.task_id IS NULL)
				  AND coalesce(ev.payload, 'null'::jsonb) = coalesce(l.payload->'payload', 'null'::jsonb))
			  AND (EXISTS (SELECT 1 FROM {schema}.events ev WHERE ev.id = (l.payload->>'event_id')::bigint)
				OR (l.payload->>'event_id')::bigint > (SELECT coalesce(last, 0) FROM issued)
				   AND (SELECT last FROM issued) IS NOT NULL)
			ELSE false END
		ORDER BY l.seq LIMIT 10`)
	// Progress entries of the log that no run wrote (the first ten): one
	// naming no task, or one of a task created at or after $2 (the log's
	// retention keeps every entry of those) whose newest status entry
	// before it is not running — Run.Progress writes only while its task
	// runs, and a fork copies a task's status entries with its progress.
	qForgedProgress = define(`SELECT l.seq FROM {schema}.conversation_log l
		LEFT JOIN {schema}.tasks t ON t.conversation_id = $1 AND t.id = l.task_id
		WHERE l.conversation_id = $1 AND l.kind = 'progress'
		  AND (l.task_id IS NULL
			OR (t.created_at >= $2 AND (SELECT s.status FROM {schema}.conversation_log s
				WHERE s.conversation_id = $1 AND s.task_id = l.task_id AND s.kind = 'status' AND s.seq < l.seq
				ORDER BY s.seq DESC LIMIT 1) IS DISTINCT FROM 'running'))
		ORDER BY l.seq LIMIT 10`)
	// The events the log says were emitted.
	qLoggedEvents = define(`SELECT DISTINCT (payload->>'event_id')::bigint FROM {schema}.conversation_log
		WHERE conversation_id = $1 AND kind = 'event' AND payload->>'event_id' ~ '^[0-9]{1,18}$'`)
)

// ConversationIDs lists every conversation, in id order.
func (s *Store) ConversationIDs(ctx context.Context, db DB) ([]string, error) {
	return collect[string](db.Query(ctx, s.sql[qConversationIDs]))
}

// DuplicateTokens lists fencing tokens held by more than one task of a
// conversation (there must be none).
func (s *Store) DuplicateTokens(ctx context.Context, db DB, conversationID string) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qDuplicateLiveTokens], conversationID))
}

// Records is what the invariant checker reads of a conversation's rows
// beside its tasks: the records a forged write (with the triggers off)
// can leave inconsistent.
type Records struct {
	// Holder and HolderID are the conversation row's; HolderRow is the
	// name of the holders row HolderID names (nil: there is none).
	Holder    string
	HolderID  int64
	HolderRow *string
	// HolderExpires is that row's deadline (nil: there is no row).
	HolderExpires *time.Time
	// Now is the database's clock; Created the conversation's birth.
	Now, Created time.Time
	// FutureLog are log entries (seq) stamped after Now by more than the
	// slack CheckRecords was given (at most ten).
	FutureLog []int64
	// ForgedDeliveries are tasks whose delivered names no event delivered
	// to them as emitted; LiveForks live tasks marked as a fork's copies.
	ForgedDeliveries, LiveForks []int64
	// Events are the conversation's events, ascending.
	Events []Event
	// LoggedEvents are the event ids the conversation's log has an emit
	// entry for.
	LoggedEvents []int64
	// ForgedLogEvents are event entries of the log (seq) that no emit
	// wrote (at most ten).
	ForgedLogEvents []int64
	// ForgedProgress are progress entries of the log (seq) that no run
	// wrote (at most ten), among those of tasks created at or after the
	// kept time CheckRecords was given.
	ForgedProgress []int64
	// Logged is, per task id the log names, what it says of the task.
	Logged []TaskLog
}

// TaskLog is what a conversation's log says of one task.
type TaskLog struct {
	TaskID int64
	// Status is the newest status entry's status ("" if it has none).
	Status string
	// Awaited are the event names the task was logged parked awaiting.
	Awaited []string
}

// CheckRecords reads the conversation's Records (in the caller's
// snapshot); slack is how far past the database's clock a log entry's time
// may be, and kept how old a task may be for the log to keep all of its
// entries (the log's retention before the database's clock).
func (s *Store) CheckRecords(ctx context.Context, db DB, conv string, slack, retention time.Duration) (Records, error) {
	var r Records
	if err := db.QueryRow(ctx, s.sql[qCheckHolder], conv).Scan(&r.Holder, &r.HolderID, &r.HolderRow, &r.HolderExpires, &r.Now, &r.Created); err != nil {
		return Records{}, err
	}
	var err error
	if r.FutureLog, err = collect[int64](db.Query(ctx, s.sql[qFutureLog], conv, slack.Microseconds())); err != nil {
		return Records{}, err
	}
	if r.ForgedDeliveries, err = collect[int64](db.Query(ctx, s.sql[qForgedDeliveries], conv)); err != nil {
		return Records{}, err
	}
	if r.LiveForks, err = collect[int64](db.Query(ctx, s.sql[qLiveForks], conv)); err != nil {
		return Records{}, err
	}
	rows, err := db.Query(ctx, s.sql[qAllEvents], conv)
	if err != nil {
		return Records{}, err
	}
	if r.Events, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) }); err != nil {
		return Records{}, err
	}
	if r.LoggedEvents, err = collect[int64](db.Query(ctx, s.sql[qLoggedEvents], conv)); err != nil {
		return Records{}, err
	}
	if r.ForgedLogEvents, err = collect[int64](db.Query(ctx, s.sql[qForgedLogEvents], conv)); err != nil {
		return Records{}, err
	}
	if r.ForgedProgress, err = collect[int64](db.Query(ctx, s.sql[qForgedProgress], conv, r.Now.Add(-retention))); err != nil {
		return Records{}, err
	}
	rows, err = db.Query(ctx, s.sql[qLogByTask], conv)
	if err != nil {
		return Records{}, err
	}
	r.Logged, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskLog, error) {
		var l TaskLog
		err := row.Scan(&l.TaskID, &l.Status, &l.Awaited)
		return l, err
	})
	return r, err
}

// OrphanRows counts, per table and conversation, the rows that name a
// conversation that does not exist (at most limit of them).
type OrphanRows struct {
	Table, ConversationID string
	Rows                  int64
}

// OrphanRows lists the rows of arbor's tables whose conversation does not
// exist, grouped by table and conversation, at most limit groups.
func (s *Store) OrphanRows(ctx context.Context, db DB, limit int) ([]OrphanRows, error) {
	rows, err := db.Query(ctx, s.sql[qOrphanRows], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrphanRows, error) {
		var o OrphanRows
		err := row.Scan(&o.Table, &o.ConversationID, &o.Rows)
		return o, err
	})
}
