package arborui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// page is what every template gets: the handler's prefix and whether it
// offers actions, the page's title and its own data.
type page struct {
	P       string
	Title   string
	Actions bool
	CSRF    string
	Code    int
	Msg     string
	Data    any
}

func (h *handler) page(title any, data any) page {
	p := page{P: h.opts.Prefix, Actions: h.opts.Actions, Data: data}
	if h.opts.Actions {
		p.CSRF = h.csrf
	}
	switch t := title.(type) {
	case int: // an error page: its status
		p.Code, p.Title = t, http.StatusText(t)
		p.Msg, _ = data.(string)
	case string:
		p.Title = t
	}
	return p
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, name string, p page) {
	var buf bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&buf, name, p); err != nil {
		h.errPage(w, r, fmt.Errorf("render %s: %w", name, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(scrub(buf.Bytes()))
}

var funcs = template.FuncMap{
	// json shows a JSON document indented; one that does not parse as it is.
	"json": func(raw json.RawMessage) string {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return string(raw)
		}
		return buf.String()
	},
	"time": func(v any) string {
		switch t := v.(type) {
		case time.Time:
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		case *time.Time:
			if t == nil {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		return fmt.Sprint(v)
	},
	"live": func(s arbortype.Status) bool { return s.Live() },
	// convURL is the address of a conversation's page (and convLive of its
	// stream), its id percent-encoded: an id may hold #, &, + or ?. Every
	// address that carries data is built here, never by a template's text.
	"convURL":  func(prefix, id string) string { return prefix + "/conversation?id=" + url.QueryEscape(id) },
	"convLive": func(prefix, id string) string { return prefix + "/conversation/live?id=" + url.QueryEscape(id) },
	"convAction": func(prefix, action, id string) string {
		return prefix + "/conversation/" + action + "?id=" + url.QueryEscape(id)
	},
	// nodeOf pairs a tree's node with its view, for the recursive "node"
	// template (a template takes one argument).
	"nodeOf": func(v treeView, n *node) nodeArg { return nodeArg{V: v, N: n} },
}

// liveRow is a conversation with live work, as the front page lists it.
type liveRow struct {
	arbortype.ConversationSummary
	Counts []statusCount
}

type statusCount struct {
	Status arbortype.Status
	N      int
}

func (h *handler) index(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	live, err := h.engine.ListConversations(ctx, tasks.ListParams{Limit: h.opts.LiveLimit})
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	recent, err := h.engine.RecentConversations(ctx, h.opts.RecentLimit)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	rows := make([]liveRow, len(live))
	for i, c := range live {
		rows[i].ConversationSummary = c
		for _, st := range arbortype.LiveStatuses {
			if n := c.Live[st]; n > 0 {
				rows[i].Counts = append(rows[i].Counts, statusCount{st, n})
			}
		}
	}
	h.render(w, r, "index.html", h.page("conversations", struct {
		Live   []liveRow
		Recent []arbortype.Conversation
	}{rows, recent}))
}

// node is a task in a drawn tree.
type node struct {
	T        arbortype.Task
	Children []*node
}

type nodeArg struct {
	V treeView
	N *node
}

// treeView is a conversation's tree, what its page shows and its live
// fragment pushes.
type treeView struct {
	page
	Conv    arbortype.Conversation
	Roots   []*node
	Count   int
	Live    int
	Pending []arbortype.PendingEvent
}

func (h *handler) treeView(ctx context.Context, conv string) (treeView, error) {
	c, err := h.engine.Conversation(ctx, conv)
	if err != nil {
		return treeView{}, err
	}
	all, err := h.engine.ConversationTasks(ctx, conv)
	if err != nil {
		return treeView{}, err
	}
	pending, err := h.engine.PendingEvents(ctx, conv)
	if err != nil {
		return treeView{}, err
	}
	v := treeView{page: h.page(conv, nil), Conv: c, Count: len(all), Pending: pending}
	// Ascending id order is ancestors first: every owner is placed before
	// its children come.
	byID := make(map[int64]*node, len(all))
	for _, t := range all {
		n := &node{T: t}
		byID[t.ID] = n
		if t.Status.Live() {
			v.Live++
		}
		if o := byID[t.OwnerID]; o != nil {
			o.Children = append(o.Children, n)
		} else {
			v.Roots = append(v.Roots, n)
		}
	}
	return v, nil
}

func (h *handler) conversation(w http.ResponseWriter, r *http.Request) {
	conv := r.URL.Query().Get("id")
	if conv == "" {
		h.errPage(w, r, badRequest("no conversation: the address needs ?id=CONVERSATION"))
		return
	}
	v, err := h.treeView(r.Context(), conv)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "conversation.html", v.page.with(v))
}

func (p page) with(data any) page { p.Data = data; return p }

// record is a task's whole record, what its page shows and its live
// fragment pushes.
type record struct {
	page
	T        arbortype.Task
	Owner    *arbortype.Task
	Children []arbortype.Task
	Await    *arbortype.PendingEvent
	Log      []arbortype.LogEntry
	// LogFrom is the count of the task's entries left out before Log.
	LogFrom int
	// Budgets are the task's own and its conversation's; Spend what the
	// task itself spent and holds, per counter.
	Budgets []arbortype.Budget
	Spend   []arbortype.Spend
}

// logShown is how many of a task's newest log entries its record shows.
const logShown = 100

func taskID(r *http.Request) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("task id %q is not a positive integer", s)
	}
	return id, nil
}

func (h *handler) record(ctx context.Context, id int64) (record, error) {
	t, err := h.engine.Get(ctx, id)
	if err != nil {
		return record{}, err
	}
	v := record{page: h.page(fmt.Sprintf("task #%d %s", t.ID, t.Kind), nil), T: t}
	if t.OwnerID != 0 {
		o, err := h.engine.Get(ctx, t.OwnerID)
		if err != nil {
			return record{}, err
		}
		v.Owner = &o
	}
	if v.Children, err = h.engine.Children(ctx, id); err != nil {
		return record{}, err
	}
	pending, err := h.engine.PendingEvents(ctx, t.ConversationID)
	if err != nil {
		return record{}, err
	}
	if i := slices.IndexFunc(pending, func(p arbortype.PendingEvent) bool { return p.TaskID == id }); i >= 0 {
		v.Await = &pending[i]
	}
	budgets, err := h.engine.Budgets(ctx, t.ConversationID)
	if err != nil {
		return record{}, err
	}
	for _, b := range budgets.Budgets {
		if b.TaskID == id || b.TaskID == 0 {
			v.Budgets = append(v.Budgets, b)
		}
	}
	for _, sp := range budgets.Spend {
		if sp.TaskID == id {
			v.Spend = append(v.Spend, sp)
		}
	}
	for after := int64(0); ; {
		entries, err := h.engine.ReadLog(ctx, t.ConversationID, after, 10000)
		if err != nil {
			return record{}, err
		}
		for _, en := range entries {
			if en.TaskID == id {
				v.Log = append(v.Log, en)
			}
			after = en.Seq
		}
		if len(v.Log) > 2*logShown {
			v.LogFrom += len(v.Log) - logShown
			v.Log = slices.Clone(v.Log[len(v.Log)-logShown:])
		}
		if len(entries) < 10000 {
			break
		}
	}
	if len(v.Log) > logShown {
		v.LogFrom += len(v.Log) - logShown
		v.Log = v.Log[len(v.Log)-logShown:]
	}
	return v, nil
}

func (h *handler) task(w http.ResponseWriter, r *http.Request) {
	id, err := taskID(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v, err := h.record(r.Context(), id)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "task.html", v.page.with(v))
}
