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

var (
	qLogBefore     = define("LogBefore")
	qLogAfter      = define("LogAfter")
	qTaskLogBefore = define("TaskLogBefore")
	qLogWindow     = define("LogWindow")
	qLastLogSeq    = define("LastLogSeq")
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
var qTaskEvents = define("TaskEvents")

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
