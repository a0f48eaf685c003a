package store

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// LogRow is a log entry whose payload may be cut: Payload holds at most
// the first characters of its text the read asked for, and PayloadBytes
// the size of its whole text.
type LogRow struct {
	LogEntry
	PayloadBytes int
}

// logRowColumns read log entry l with its payload cut to $cut characters.
const logRowColumns = `l.seq, l.conversation_id, coalesce(l.task_id, 0), l.kind, coalesce(l.status, ''), coalesce(l.name, ''),
		left(l.payload::text, $cut), coalesce(octet_length(l.payload::text), 0), l.at`

var (
	qLogBefore = define(`SELECT ` + expand(logRowColumns, "$cut", "$4") + ` FROM {schema}.conversation_log l
		WHERE l.conversation_id = $1 AND l.seq < $2 ORDER BY l.seq DESC LIMIT $3`)
	qLogAfter = define(`SELECT ` + expand(logRowColumns, "$cut", "$4") + ` FROM {schema}.conversation_log l
		WHERE l.conversation_id = $1 AND l.seq > $2 ORDER BY l.seq LIMIT $3`)
	// A task's entries among the conversation's $5 entries below $2 (the
	// log has no index by task).
	qTaskLogBefore = define(`SELECT ` + expand(logRowColumns, "$cut", "$6") + ` FROM (
			SELECT * FROM {schema}.conversation_log w
			WHERE w.conversation_id = $1 AND w.seq < $2 ORDER BY w.seq DESC LIMIT $5) l
		WHERE l.task_id = $3 ORDER BY l.seq DESC LIMIT $4`)
	qLogWindow = define(`SELECT count(*), coalesce(min(w.seq), 0) FROM (
			SELECT seq FROM {schema}.conversation_log WHERE conversation_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3) w`)
	// The last entry of every conversation's log: one probe of the
	// primary key's end.
	qLastLogSeq = define(`SELECT coalesce(max(seq), 0) FROM {schema}.conversation_log`)
)

func collectLogRows(rows pgx.Rows, err error) ([]LogRow, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LogRow, error) {
		var (
			e       LogRow
			st      string
			payload *string
		)
		err := row.Scan(&e.Seq, &e.ConversationID, &e.TaskID, &e.Kind, &st, &e.Name, &payload, &e.PayloadBytes, &e.At)
		e.Status = arbortype.Status(st)
		if payload != nil {
			e.Payload = json.RawMessage(*payload)
		}
		return e, err
	})
}

// LogBefore reads up to limit entries of conv's log below seq before, the
// newest first, payloads cut to cut characters.
func (s *Store) LogBefore(ctx context.Context, db DB, conv string, before int64, limit, cut int) ([]LogRow, error) {
	return collectLogRows(db.Query(ctx, s.sql[qLogBefore], conv, before, limit, cut))
}

// LogAfter reads up to limit entries of conv's log after seq after, in
// order, payloads cut to cut characters.
func (s *Store) LogAfter(ctx context.Context, db DB, conv string, after int64, limit, cut int) ([]LogRow, error) {
	return collectLogRows(db.Query(ctx, s.sql[qLogAfter], conv, after, limit, cut))
}

// TaskLogBefore reads up to limit entries of task taskID among the scan
// entries of conv's log below seq before, the newest first, payloads cut
// to cut characters.
func (s *Store) TaskLogBefore(ctx context.Context, db DB, conv string, taskID, before int64, limit, scan, cut int) ([]LogRow, error) {
	return collectLogRows(db.Query(ctx, s.sql[qTaskLogBefore], conv, before, taskID, limit, scan, cut))
}

// LogWindow counts the entries of conv's log below seq before, up to
// scan of them, and returns the lowest seq among those.
func (s *Store) LogWindow(ctx context.Context, db DB, conv string, before int64, scan int) (n int, low int64, err error) {
	err = db.QueryRow(ctx, s.sql[qLogWindow], conv, before, scan).Scan(&n, &low)
	return n, low, err
}

// LastLogSeq is the seq of the newest entry of any conversation's log (0:
// none).
func (s *Store) LastLogSeq(ctx context.Context, db DB) (int64, error) {
	var seq int64
	err := db.QueryRow(ctx, s.sql[qLastLogSeq]).Scan(&seq)
	return seq, err
}

// EventRow is an event whose payload may be cut, as LogRow's.
type EventRow struct {
	Event
	PayloadBytes int
}

// The events addressed to a task and those delivered to it (their two
// indexes), the newest first.
var qTaskEvents = define(`SELECT id, conversation_id, coalesce(task_id, 0), name, left(payload::text, $4),
			coalesce(octet_length(payload::text), 0), coalesce(idempotency_key, ''), queued, emitted_at,
			coalesce(delivered_to, 0), delivered_at
		FROM {schema}.events WHERE conversation_id = $1 AND (task_id = $2 OR delivered_to = $2)
		ORDER BY id DESC LIMIT $3`)

// TaskEvents reads up to limit events addressed or delivered to taskID,
// the newest first, payloads cut to cut characters.
func (s *Store) TaskEvents(ctx context.Context, db DB, conv string, taskID int64, limit, cut int) ([]EventRow, error) {
	rows, err := db.Query(ctx, s.sql[qTaskEvents], conv, taskID, limit, cut)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventRow, error) {
		var (
			e       EventRow
			payload *string
		)
		err := row.Scan(&e.ID, &e.ConversationID, &e.TaskID, &e.Name, &payload, &e.PayloadBytes, &e.IdempotencyKey,
			&e.Queued, &e.EmittedAt, &e.DeliveredTo, &e.DeliveredAt)
		if payload != nil {
			e.Payload = json.RawMessage(*payload)
		}
		return e, err
	})
}
