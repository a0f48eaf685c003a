package arborui

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strconv"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// A conversation's log, beside its tree: the newest logShown entries
// (status changes, progress, events), newest first, and a stream that
// adds each new one; the page of the whole log, older entries a page at
// a time. Payloads are cut to logPayload characters.

const (
	// logShown is how many entries the log beside a tree (and a task's
	// log) shows, and the most a page of the log shows.
	logShown = 100
	// logPayload is how many characters of an entry's payload are shown.
	logPayload = 2048
)

// logRow is a log entry as the view shows it.
type logRow struct {
	inspect.LogListing
	// Requeued: a pending after running — the task's run was recovered
	// (its holder gone: a take-over, or a restart) or released.
	Requeued bool
}

// logView is a conversation's log, a page of it.
type logView struct {
	P    string
	Conv string
	Rows []logRow
	// Gap says entries were left out before Rows (a stream's batch).
	Gap bool
	// Older is the address of the page of older entries; Stream the
	// live address of what comes after Rows.
	Older, Stream string
}

// requeues marks the entries that requeued their task, given the entries
// in log order; last is each task's status as the entries before had it
// (kept across calls by a stream; bounded by its caller).
func requeues(rows []logRow, last map[int64]arbortype.Status) {
	for i := range rows {
		r := &rows[i]
		if r.Kind != arbortype.LogKindStatus || r.TaskID == 0 {
			continue
		}
		r.Requeued = r.Status == arbortype.StatusPending && last[r.TaskID] == arbortype.StatusRunning
		last[r.TaskID] = r.Status
	}
}

func toRows(entries []inspect.LogListing) []logRow {
	out := make([]logRow, len(entries))
	for i, e := range entries {
		out[i].LogListing = e
	}
	return out
}

// logView reads the page of conv's log below before (0: the newest).
func (h *handler) logView(ctx context.Context, conv string, before int64) (logView, error) {
	page, err := h.reader.ReadLogPage(ctx, inspect.LogQuery{ConversationID: conv, Before: before, Limit: logShown, MaxPayload: logPayload})
	if err != nil {
		return logView{}, err
	}
	rows := toRows(page.Entries)
	slices.Reverse(rows) // in log order, to mark the requeues
	requeues(rows, map[int64]arbortype.Status{})
	slices.Reverse(rows)
	v := logView{P: h.opts.Prefix, Conv: conv, Rows: rows}
	if page.Older != 0 {
		v.Older = link(h.opts.Prefix, "/conversation/log", "id", conv, "before", page.Older)
	}
	if before == 0 {
		var head int64
		if len(rows) > 0 {
			head = rows[0].Seq
		}
		v.Stream = link(h.opts.Prefix, "/conversation/log/live", "id", conv, "after", strconv.FormatInt(head, 10))
	}
	return v, nil
}

// conversationLog is the page of a conversation's log: a page of entries
// below ?before= (the newest without it).
func (h *handler) conversationLog(w http.ResponseWriter, r *http.Request) {
	conv := r.URL.Query().Get("id")
	if conv == "" {
		h.errPage(w, r, badRequest("no conversation: the address needs ?id=CONVERSATION"))
		return
	}
	before, err := seqParam(r, "before")
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	if _, err := h.engine.Conversation(r.Context(), conv); err != nil {
		h.errPage(w, r, err)
		return
	}
	v, err := h.logView(r.Context(), conv, before)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "log.html", h.page("log of "+conv, v).in("conversations"))
}

// conversationLogLive streams the entries of a conversation's log after
// ?after=, each batch as an "append" event of rows, newest first. A batch
// holds at most logShown: when more came at once, the newest logShown
// are sent after a row that says entries were left out.
func (h *handler) conversationLogLive(w http.ResponseWriter, r *http.Request) {
	conv := r.URL.Query().Get("id")
	if conv == "" {
		h.errPage(w, r, badRequest("no conversation: the address needs ?id=CONVERSATION"))
		return
	}
	after, err := seqParam(r, "after")
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	last := map[int64]arbortype.Status{}
	h.serve(w, r, stream{conv: conv, render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		q := inspect.LogQuery{ConversationID: conv, After: after, Limit: logShown + 1, MaxPayload: logPayload}
		if after == 0 {
			q = inspect.LogQuery{ConversationID: conv, Limit: logShown, MaxPayload: logPayload}
		}
		page, err := h.reader.ReadLogPage(ctx, q)
		if err != nil {
			return "", false, err
		}
		entries, gap := page.Entries, false
		switch {
		case after == 0:
			slices.Reverse(entries)
		case len(entries) > logShown:
			// More than a batch came: the newest logShown, after a gap.
			newest, err := h.reader.ReadLogPage(ctx, inspect.LogQuery{ConversationID: conv, Limit: logShown, MaxPayload: logPayload})
			if err != nil {
				return "", false, err
			}
			entries, gap = newest.Entries, true
			slices.Reverse(entries)
		}
		if len(entries) == 0 {
			return "", true, nil
		}
		if len(last) > 10_000 {
			clear(last) // bounded; a requeue just after is not marked
		}
		rows := toRows(entries)
		requeues(rows, last)
		after = rows[len(rows)-1].Seq
		slices.Reverse(rows)
		return "append", false, h.tmpl.ExecuteTemplate(buf, "logRows", logView{P: h.opts.Prefix, Conv: conv, Rows: rows, Gap: gap})
	}})
}

// seqParam reads a log position from the query (0 when absent).
func seqParam(r *http.Request, name string) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%s %q is not a position in the log", name, s)
	}
	return n, nil
}
