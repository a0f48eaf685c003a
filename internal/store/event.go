package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Events, awaits and the conversation log (the schema baseline).

// Event is a row of the events table.
type Event struct {
	ID             int64
	ConversationID string
	TaskID         int64 // 0: addressed to the conversation
	Name           string
	Payload        json.RawMessage
	IdempotencyKey string
	Queued         bool
	EmittedAt      time.Time
	DeliveredTo    int64
	DeliveredAt    *time.Time
}

// Arbor returns ev as the public package's type.
func (ev Event) Arbor() arbortype.Event {
	return arbortype.Event{ID: ev.ID, ConversationID: ev.ConversationID, TaskID: ev.TaskID, Name: ev.Name,
		Payload: ev.Payload, Queued: ev.Queued, IdempotencyKey: ev.IdempotencyKey, EmittedAt: ev.EmittedAt,
		DeliveredTo: ev.DeliveredTo, DeliveredAt: ev.DeliveredAt}
}

func scanEvent(row pgx.Row) (Event, error) {
	var e Event
	err := row.Scan(&e.ID, &e.ConversationID, &e.TaskID, &e.Name, &e.Payload, &e.IdempotencyKey, &e.Queued,
		&e.EmittedAt, &e.DeliveredTo, &e.DeliveredAt)
	return e, err
}

// LogEntry is a row of the conversation log.
type LogEntry struct {
	Seq            int64
	ConversationID string
	TaskID         int64
	Kind           arbortype.LogKind
	Status         arbortype.Status
	Name           string
	Payload        json.RawMessage
	At             time.Time
}

var (
	qEventByKey         = define("EventByKey")
	qFirstWinsEvent     = define("FirstWinsEvent")
	qInsertEvent        = define("InsertEvent")
	qUndeliveredFor     = define("UndeliveredFor")
	qMarkDelivered      = define("MarkDelivered")
	qOldestAwaiting     = define("OldestAwaiting")
	qAwaitTask          = define("AwaitTask")
	qDeliverTask        = define("DeliverTask")
	qPendingAwaits      = define("PendingAwaits")
	qTaskByAwaitToken   = define("TaskByAwaitToken")
	qAppendLog          = define("AppendLog")
	qReadLog            = define("ReadLog")
	qLogHead            = define("LogHead")
	qPruneLog           = define("PruneLog")
	qUndeliveredEvents  = define("UndeliveredEvents")
	qConversationEvents = define("ConversationEvents")
	qLiveDeadlines      = define("LiveDeadlines")
)

// EventByKey reads the event of a conversation with an idempotency key.
func (s *Store) EventByKey(ctx context.Context, db DB, conv, key string) (Event, error) {
	return scanEvent(db.QueryRow(ctx, s.sql[qEventByKey], conv, key))
}

// ConversationEvents reads up to limit events of conv with ids after
// after, in id order.
func (s *Store) ConversationEvents(ctx context.Context, db DB, conv string, after int64, limit int) ([]Event, error) {
	rows, err := db.Query(ctx, s.sql[qConversationEvents], conv, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) })
}

// FirstWinsEvent reads the newest first-wins event of a name at an
// address (task 0: the conversation): the decision a repeated emit
// returns.
func (s *Store) FirstWinsEvent(ctx context.Context, db DB, conv, name string, taskID int64) (Event, error) {
	return scanEvent(db.QueryRow(ctx, s.sql[qFirstWinsEvent], conv, name, taskID))
}

// InsertEvent inserts an undelivered event.
func (s *Store) InsertEvent(ctx context.Context, db DB, conv string, taskID int64, name string, payload json.RawMessage, key string, queued bool) (Event, error) {
	return scanEvent(db.QueryRow(ctx, s.sql[qInsertEvent], conv, taskID, name, nullJSON(payload), key, queued))
}

// UndeliveredFor locks the oldest undelivered event an await of name by
// taskID takes.
func (s *Store) UndeliveredFor(ctx context.Context, db DB, conv, name string, taskID int64) (Event, error) {
	return scanEvent(db.QueryRow(ctx, s.sql[qUndeliveredFor], conv, name, taskID))
}

// MarkDelivered records that event id woke task taskID.
func (s *Store) MarkDelivered(ctx context.Context, db DB, conv string, id, taskID int64) error {
	_, err := db.Exec(ctx, s.sql[qMarkDelivered], id, taskID, conv)
	return err
}

// OldestAwaiting locks the oldest task of conv awaiting name.
func (s *Store) OldestAwaiting(ctx context.Context, db DB, conv, name string) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qOldestAwaiting], conv, name))
}

// AwaitTask parks a running task (to: sleeping) awaiting name, with a
// fresh token, until wakeAt (nil: no timeout) with wake job jobID.
func (s *Store) AwaitTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, phase string, state json.RawMessage, name, token string, wakeAt *time.Time, jobID int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qAwaitTask], id, string(to), phase, nullJSON(state), name, token, wakeAt, jobID, conv))
}

// DeliverTask wakes an awaiting task (to: pending) with what woke it.
func (s *Store) DeliverTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, delivered json.RawMessage) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qDeliverTask], id, string(to), delivered, conv))
}

// PendingAwaits lists the tasks of conv awaiting an event.
func (s *Store) PendingAwaits(ctx context.Context, db DB, conv string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qPendingAwaits], conv))
}

// TaskByAwaitToken reads the task whose current (or last) await has
// token: how a token of the form that does not name its task is found.
func (s *Store) TaskByAwaitToken(ctx context.Context, db DB, token string) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qTaskByAwaitToken], token))
}

// AppendLog appends an entry of kind (progress, event) to conv's log.
func (s *Store) AppendLog(ctx context.Context, db DB, conv string, taskID int64, kind arbortype.LogKind, name string, payload json.RawMessage) (int64, error) {
	var seq int64
	err := db.QueryRow(ctx, s.sql[qAppendLog], conv, taskID, string(kind), name, nullJSON(payload)).Scan(&seq)
	return seq, err
}

// ReadLog reads up to limit entries of conv's log after seq after.
func (s *Store) ReadLog(ctx context.Context, db DB, conv string, after int64, limit int) ([]LogEntry, error) {
	rows, err := db.Query(ctx, s.sql[qReadLog], conv, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LogEntry, error) {
		var (
			e  LogEntry
			st string
		)
		err := row.Scan(&e.Seq, &e.ConversationID, &e.TaskID, &e.Kind, &st, &e.Name, &e.Payload, &e.At)
		e.Status = arbortype.Status(st)
		return e, err
	})
}

// LogHead is the last seq of conv's log (0: none).
func (s *Store) LogHead(ctx context.Context, db DB, conv string) (int64, error) {
	var seq int64
	err := db.QueryRow(ctx, s.sql[qLogHead], conv).Scan(&seq)
	return seq, err
}

// PruneLog deletes up to limit log entries older than keep, oldest first,
// and returns how many.
func (s *Store) PruneLog(ctx context.Context, db DB, keep time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, s.sql[qPruneLog], micros(keep), limit)
	return tag.RowsAffected(), err
}

// UndeliveredEvents lists the undelivered events of conv.
func (s *Store) UndeliveredEvents(ctx context.Context, db DB, conv string) ([]Event, error) {
	rows, err := db.Query(ctx, s.sql[qUndeliveredEvents], conv)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) })
}

// LiveDeadlines lists up to limit live tasks past their deadline.
func (s *Store) LiveDeadlines(ctx context.Context, db DB, limit int) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qLiveDeadlines], limit))
}

// LogChannel is the LISTEN/NOTIFY channel on which the conversations whose
// log grew are announced, after their commits (see core's announce.go):
// the runners do not listen to it, the log's followers do.
func (s *Store) LogChannel() string { return s.ChangeChannel() + "_log" }
