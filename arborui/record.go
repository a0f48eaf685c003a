package arborui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// A task's page: its whole record — attempts and their errors,
// checkpoint (phase and state), input and result, the events it
// received, a page of its children, its budgets and spend, its trace, a
// page of its log entries — live, fed by its conversation's log.

const (
	// docShown is how much of a JSON document (input, state, result, an
	// error's detail) a task's page shows; the rest is behind a link to
	// the document itself.
	docShown = 64 << 10
	// childrenShown is how many children a page of a task's shows.
	childrenShown = 50
	// eventsShown is how many of the events it received a task's page
	// shows, the newest.
	eventsShown = 20
)

// doc is a JSON document as a page shows it: indented, cut to docShown
// bytes (Cut, with its whole size and where to read it all).
type doc struct {
	Text  string
	Bytes int
	Cut   bool
	URL   string
}

func (h *handler) doc(taskID int64, field string, raw json.RawMessage) *doc {
	if len(raw) == 0 {
		return nil
	}
	d := &doc{Bytes: len(raw)}
	var buf bytes.Buffer
	if len(raw) <= docShown && json.Indent(&buf, raw, "", "  ") == nil && buf.Len() <= docShown {
		d.Text = buf.String()
		return d
	}
	if len(raw) <= docShown {
		d.Text = string(raw)
		return d
	}
	cut := docShown
	for cut > 0 && !utf8.RuneStart(raw[cut]) {
		cut--
	}
	d.Text, d.Cut = string(raw[:cut]), true
	d.URL = fmt.Sprintf("%s/tasks/%d/doc/%s", h.opts.Prefix, taskID, field)
	return d
}

// record is a task's whole record, what its page shows and its live
// fragment pushes.
type record struct {
	page
	T     arbortype.Task
	Owner *arbortype.Task
	// Input, State, Result and Detail (its error's) are its documents.
	Input, State, Result, Detail *doc
	// Parked says it is parked in an await (T.AwaitName, T.AwaitToken,
	// T.WakeAt its timeout).
	Parked bool
	// Park says it is parked on a budget (no answer ends it: a raise
	// does), ParkBudgets the park budgets above it.
	Park        bool
	ParkBudgets []arbortype.Budget
	Events      []inspect.EventListing
	Children    inspect.ChildrenPage
	// ChildrenNext is the address of the next page of its children.
	ChildrenNext string
	// Log is a page of its log entries (Log.Older unused).
	Log logView
	// LogOlder is the address of the page of its older log entries.
	LogOlder string
	// Budgets are those its spend counts against (its own, its owners',
	// its conversation's); Spend what it spent and holds itself.
	Budgets []arbortype.Budget
	Spend   []arbortype.Spend
	// Durations are its times queued, in each status and in all, and
	// Timeline its bar beside its children's (the page's).
	Durations durations
	Timeline  timeline
	// TraceID is the trace it was created in (its traceparent's), and
	// TraceURL its link to the tracing UI (Options.TraceURL).
	TraceID, TraceURL string
	// Back is the page's own address (an action's "back"), Stream its
	// live one.
	Back, Stream string
}

// recordQuery is a task page's address: the task, where the page of its
// children starts, and where the page of its log ends.
type recordQuery struct {
	ID            int64
	ChildrenAfter int64
	LogBefore     int64
}

func taskID(r *http.Request) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("task id %q is not a positive integer", s)
	}
	return id, nil
}

func parseRecordQuery(r *http.Request) (recordQuery, error) {
	id, err := taskID(r)
	if err != nil {
		return recordQuery{}, err
	}
	q := recordQuery{ID: id}
	if q.ChildrenAfter, err = seqParam(r, "children_after"); err != nil {
		return q, err
	}
	q.LogBefore, err = seqParam(r, "log_before")
	return q, err
}

func (q recordQuery) url(prefix, path string, childrenAfter, logBefore int64) string {
	return link(prefix, path, "children_after", childrenAfter, "log_before", logBefore)
}

func (h *handler) record(ctx context.Context, q recordQuery) (record, error) {
	t, err := h.engine.Get(ctx, q.ID)
	if err != nil {
		return record{}, err
	}
	self := fmt.Sprintf("/tasks/%d", t.ID)
	v := record{page: h.page(fmt.Sprintf("task #%d %s", t.ID, t.Kind), nil).in("conversations"), T: t,
		Input: h.doc(t.ID, "input", t.Input), State: h.doc(t.ID, "state", t.State), Result: h.doc(t.ID, "result", t.Result),
		TraceID: traceID(t.Trace), Back: q.url(h.opts.Prefix, self, q.ChildrenAfter, q.LogBefore),
		Stream: q.url(h.opts.Prefix, self+"/live", q.ChildrenAfter, q.LogBefore)}
	v.TraceURL = h.traceLink(v.TraceID)
	if t.Error != nil {
		v.Detail = h.doc(t.ID, "detail", t.Error.Detail)
	}
	if t.OwnerID != 0 {
		o, err := h.engine.Get(ctx, t.OwnerID)
		if err != nil {
			return record{}, err
		}
		v.Owner = &o
	}
	if v.Children, err = h.reader.ChildrenAfter(ctx, q.ID, q.ChildrenAfter, childrenShown); err != nil {
		return record{}, err
	}
	if v.Children.Next != 0 {
		v.ChildrenNext = q.url(h.opts.Prefix, self, v.Children.Next, q.LogBefore)
	}
	// Parked in an await: sleeping with its name (what PendingEvents
	// lists); the row holds its token and timeout.
	v.Parked = t.Status == arbortype.StatusSleeping && t.AwaitName != ""
	if v.Park = budgetPark(t); v.Park {
		if v.ParkBudgets, err = h.parkedOn(ctx, t); err != nil {
			return record{}, err
		}
	}
	if v.Events, err = h.reader.TaskEvents(ctx, q.ID, eventsShown, logPayload); err != nil {
		return record{}, err
	}
	budgets, err := h.reader.TaskBudgets(ctx, q.ID)
	if err != nil {
		return record{}, err
	}
	v.Budgets, v.Spend = budgets.Budgets, budgets.Spend
	log, err := h.reader.ReadLogPage(ctx, inspect.LogQuery{ConversationID: t.ConversationID, TaskID: t.ID, Before: q.LogBefore,
		Limit: logShown, MaxPayload: logPayload})
	if err != nil {
		return record{}, err
	}
	rows := toRows(log.Entries)
	slices.Reverse(rows)
	requeues(rows, map[int64]arbortype.Status{})
	slices.Reverse(rows)
	v.Log = logView{P: h.opts.Prefix, Conv: t.ConversationID, Rows: rows}
	if log.Older != 0 {
		v.LogOlder = q.url(h.opts.Prefix, self, q.ChildrenAfter, log.Older)
	}
	now := time.Now()
	v.Durations = durationsOf(t, rows, log.Older != 0 || q.LogBefore != 0, now)
	v.Timeline = timelineOf(t, rows, v.Children.Tasks, v.Children.Next != 0 || q.ChildrenAfter != 0, now)
	return v, nil
}

func (h *handler) task(w http.ResponseWriter, r *http.Request) {
	q, err := parseRecordQuery(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v, err := h.record(r.Context(), q)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v.page.Title = fmt.Sprintf("task #%d %s", v.T.ID, v.T.Kind)
	h.render(w, r, "task.html", v.page.with(v))
}

// taskLive streams a task's record, again after every change to its
// conversation's log.
func (h *handler) taskLive(w http.ResponseWriter, r *http.Request) {
	q, err := parseRecordQuery(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	t, err := h.engine.Get(r.Context(), q.ID)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.serve(w, r, stream{conv: t.ConversationID, render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		v, err := h.record(ctx, q)
		if err != nil {
			return "", false, err
		}
		return "fragment", false, h.tmpl.ExecuteTemplate(buf, "record", v)
	}})
}

// taskDoc serves one of a task's documents whole (its page shows the
// first docShown bytes), as JSON: input, state, result, or its error's
// detail. Raw C1 controls and bidirectional overrides in it (which JSON
// strings may hold) are written as \u escapes, which mean the same.
func (h *handler) taskDoc(w http.ResponseWriter, r *http.Request) {
	id, err := taskID(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	t, err := h.engine.Get(r.Context(), id)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	var raw json.RawMessage
	switch field := r.PathValue("field"); field {
	case "input":
		raw = t.Input
	case "state":
		raw = t.State
	case "result":
		raw = t.Result
	case "detail":
		if t.Error != nil {
			raw = t.Error.Detail
		}
	default:
		h.errPage(w, r, &requestError{code: http.StatusNotFound, msg: fmt.Sprintf("no document %q (input, state, result, detail)", field)})
		return
	}
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(escapeJSON(raw))
}

// escapeJSON writes the runes scrub replaces as \u escapes: in a JSON
// document they can only be inside strings (the rest are escaped by
// PostgreSQL already), where an escape means the same.
func escapeJSON(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if isActingRune(r) || r < 0x20 && r != '\n' && r != '\t' && r != '\r' || r == 0x7f {
			if out == nil {
				out = append(make([]byte, 0, len(b)+16), b[:i]...)
			}
			out = fmt.Appendf(out, `\u%04x`, r)
		} else if out != nil {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	if out == nil {
		return b
	}
	return out
}
