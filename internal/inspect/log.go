package inspect

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// LogQuery reads a page of a conversation's log (Engine.ReadLogPage).
type LogQuery struct {
	ConversationID string
	// TaskID keeps the entries of one task; 0 keeps all.
	TaskID int64
	// After, when not 0, reads the entries after it, in order (a tail
	// that follows). Otherwise the page is of the entries below Before (0:
	// from the newest), the newest first.
	After, Before int64
	// Limit is the most entries a page returns (1..5000). Default
	// PageLimitDefault (50).
	Limit int
	// Scan bounds, for a task's entries below Before, how many of the
	// conversation's entries are read to find them (1..100,000; the log
	// has no index by task). Default PageScanDefault (10,000).
	Scan int
	// MaxPayload is the most characters of a payload returned
	// (1..1,048,576); a longer one is cut (see LogListing). Default 4096.
	MaxPayload int
}

// MaxPayloadDefault is LogQuery's and TaskEvents's default cut.
const MaxPayloadDefault = 4096

// LogListing is a log entry whose payload may be cut: when PayloadBytes
// is over len(Payload), Payload is the first characters of the payload's
// text and no longer JSON.
type LogListing struct {
	arbortype.LogEntry
	// PayloadBytes is the size of the whole payload's text.
	PayloadBytes int
}

// Cut says the payload was cut.
func (l LogListing) Cut() bool { return l.PayloadBytes > len(l.Payload) }

// LogPage is a page of a conversation's log.
type LogPage struct {
	Entries []LogListing
	// Older is the Before of the page of older entries; 0 when there are
	// none. (After a page read with After, take the last entry's Seq.)
	Older int64
}

// ReadLogPage reads a page of a conversation's log, payloads cut to
// q.MaxPayload: a tail after q.After, or the entries below q.Before,
// newest first. A task's entries below q.Before are looked for among
// q.Scan entries of the conversation's, and Older continues below those.
// arbortype.ErrNotFound when the conversation does not exist.
func (e *Reader) ReadLogPage(ctx context.Context, q LogQuery) (LogPage, error) {
	if q.Limit == 0 {
		q.Limit = PageLimitDefault
	}
	if q.Scan == 0 {
		q.Scan = PageScanDefault
	}
	if q.MaxPayload == 0 {
		q.MaxPayload = MaxPayloadDefault
	}
	type result struct {
		rows    []store.LogRow
		scanned int
		low     int64
	}
	r, err := core.Read(ctx, e.core, func(db store.DB) (result, error) {
		rows, n, low, err := e.core.LogPage(ctx, db, q.ConversationID, q.TaskID, q.After, q.Before, q.Limit, q.Scan, q.MaxPayload)
		return result{rows, n, low}, err
	})
	if err != nil {
		return LogPage{}, err
	}
	out := LogPage{}
	for _, row := range r.rows {
		out.Entries = append(out.Entries, LogListing{LogEntry: arbortype.LogEntry(row.LogEntry), PayloadBytes: row.PayloadBytes})
	}
	switch {
	case q.After > 0:
	case q.TaskID != 0 && len(r.rows) == q.Limit:
		out.Older = r.rows[len(r.rows)-1].Seq
	case q.TaskID != 0 && r.scanned == q.Scan && r.low > 1:
		out.Older = r.low
	case q.TaskID == 0 && len(r.rows) == q.Limit && r.rows[len(r.rows)-1].Seq > 1:
		out.Older = r.rows[len(r.rows)-1].Seq
	}
	return out, nil
}

// LastLogSeq returns the seq of the newest entry of any conversation's
// log (0: none), in one probe of the log's primary key: a cheap test of
// whether anything was logged since the last call.
func (e *Reader) LastLogSeq(ctx context.Context) (int64, error) {
	return core.Read(ctx, e.core, func(db store.DB) (int64, error) { return e.core.LastLogSeq(ctx, db) })
}

// EventListing is an event whose payload may be cut, as LogListing's.
type EventListing struct {
	arbortype.Event
	// PayloadBytes is the size of the whole payload's text.
	PayloadBytes int
}

// Cut says the payload was cut.
func (l EventListing) Cut() bool { return l.PayloadBytes > len(l.Payload) }

// TaskEvents reads up to limit (1..5000) events addressed or delivered to
// taskID, the newest first, payloads cut to maxPayload characters (0:
// MaxPayloadDefault). arbortype.ErrNotFound when the task does not exist.
func (e *Reader) TaskEvents(ctx context.Context, taskID int64, limit, maxPayload int) ([]EventListing, error) {
	if maxPayload == 0 {
		maxPayload = MaxPayloadDefault
	}
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.EventRow, error) {
		return e.core.TaskEvents(ctx, db, taskID, limit, maxPayload)
	})
	if err != nil {
		return nil, err
	}
	out := make([]EventListing, len(rows))
	for i, r := range rows {
		out[i] = EventListing{Event: r.Event.Arbor(), PayloadBytes: r.PayloadBytes}
	}
	return out, nil
}
