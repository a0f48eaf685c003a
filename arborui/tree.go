package arborui

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// A conversation's page: its tree, a page of at most Options.TreeLimit
// tasks in id order (ancestors first), each under its owner when the
// owner is on the page, with what the page leaves out counted; what it
// awaits from outside; its log beside the tree. The tree and the log are
// live, each a stream fed by the conversation's log.

// node is a task in a drawn tree.
type node struct {
	T        inspect.TaskSummary
	Children []*node
	// More counts the task's children this page does not draw.
	More int
	// Under is its owner, when the page does not draw it (0: it does, or
	// the task is a root).
	Under int64
	// Queued: a turn pending behind an older live turn; Stuck says why
	// the task is stuck, if it is (see health.go).
	Queued bool
	Stuck  string
}

type nodeArg struct {
	V treeView
	N *node
}

// treeQuery is a tree page's address: the conversation, a status to keep
// (or none) and where the page starts.
type treeQuery struct {
	Conv   string
	Status string
	After  int64
}

func parseTreeQuery(q url.Values) (treeQuery, error) {
	t := treeQuery{Conv: q.Get("id"), Status: q.Get("status")}
	if t.Conv == "" {
		return t, badRequest("no conversation: the address needs ?id=CONVERSATION")
	}
	if t.Status != "" && t.Status != "live" && !arbortype.Status(t.Status).Valid() {
		return t, badRequest("status %q is not a status (nor \"live\")", t.Status)
	}
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return t, badRequest("after %q is not a task id", s)
		}
		t.After = n
	}
	return t, nil
}

func (t treeQuery) url(prefix, path string, after int64) string {
	return link(prefix, path, "id", t.Conv, "status", t.Status, "after", after)
}

// treeView is a conversation's tree, what its page shows and its live
// fragment pushes.
type treeView struct {
	page
	Q        treeQuery
	Statuses []arbortype.Status
	Conv     arbortype.Conversation
	Roots    []*node
	// Shown is how many tasks the page draws, Count the conversation's
	// (at least, when Capped), Live its live ones.
	Shown, Count, Live int
	Capped             bool
	Counts             []statusCount
	Awaits             []inspect.AwaitListing
	MoreAwaits         bool
	// Health is the conversation's queued turns and why it is stuck.
	Health health
	// Back is the page's own address (an action's "back"); Next and First
	// the pager's; Stream the tree's live address.
	Back, Next, First, Stream string
	Now                       time.Time
}

type statusCount struct {
	Status arbortype.Status
	N      int
}

func (h *handler) treeView(ctx context.Context, q treeQuery) (treeView, error) {
	c, err := h.engine.Conversation(ctx, q.Conv)
	if err != nil {
		return treeView{}, err
	}
	tq := inspect.TreeQuery{ConversationID: q.Conv, After: q.After, Limit: h.opts.TreeLimit}
	switch q.Status {
	case "":
	case "live":
		tq.Statuses = arbortype.LiveStatuses
	default:
		tq.Statuses = []arbortype.Status{arbortype.Status(q.Status)}
	}
	tp, err := h.reader.Tree(ctx, tq)
	if err != nil {
		return treeView{}, err
	}
	states, err := h.conversationStates(ctx, []string{q.Conv})
	if err != nil {
		return treeView{}, err
	}
	state := states[q.Conv]
	awaits, err := h.reader.Awaits(ctx, inspect.AwaitQuery{ConversationID: q.Conv, Limit: 20})
	if err != nil {
		return treeView{}, err
	}
	v := treeView{page: h.page(q.Conv, nil).in("conversations"), Q: q, Statuses: arbortype.Statuses, Conv: c,
		Shown: len(tp.Tasks), Capped: tp.CountsCapped, Awaits: awaits.Awaits, MoreAwaits: awaits.Next != "",
		Back: q.url(h.opts.Prefix, "/conversation", q.After), Stream: q.url(h.opts.Prefix, "/conversation/live", q.After),
		Now: time.Now()}
	if !state.Now.IsZero() {
		v.Health = conversationHealth(arbortype.ConversationSummary{Conversation: c, Live: tp.Counts}, state)
	}
	for _, st := range arbortype.Statuses {
		if n := tp.Counts[st]; n > 0 {
			v.Counts = append(v.Counts, statusCount{st, n})
			v.Count += n
			if st.Live() {
				v.Live += n
			}
		}
	}
	if tp.Next != 0 {
		v.Next = q.url(h.opts.Prefix, "/conversation", tp.Next)
	}
	if q.After != 0 {
		v.First = q.url(h.opts.Prefix, "/conversation", 0)
	}
	// Ascending id order is ancestors first: every owner on the page is
	// placed before its children come. A task whose owner is not on the
	// page is drawn at the top, saying whose it is.
	byID := make(map[int64]*node, len(tp.Tasks))
	for _, t := range tp.Tasks {
		n := &node{T: t, More: tp.Children[t.ID]}
		n.Queued, n.Stuck = taskState(t.Task, c, state)
		byID[t.ID] = n
		if o := byID[t.OwnerID]; o != nil {
			o.Children = append(o.Children, n)
			o.More--
		} else {
			n.Under = t.OwnerID
			v.Roots = append(v.Roots, n)
		}
	}
	return v, nil
}

// conversationView is a conversation's page: its tree and its log.
type conversationView struct {
	Tree treeView
	Log  logView
}

func (h *handler) conversation(w http.ResponseWriter, r *http.Request) {
	q, err := parseTreeQuery(r.URL.Query())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v, err := h.treeView(r.Context(), q)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	lv, err := h.logView(r.Context(), q.Conv, 0)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "conversation.html", v.page.with(conversationView{Tree: v, Log: lv}))
}

// conversationLive streams a conversation's tree page: at once, then
// again after every change to its log.
func (h *handler) conversationLive(w http.ResponseWriter, r *http.Request) {
	q, err := parseTreeQuery(r.URL.Query())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.serve(w, r, stream{conv: q.Conv, render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
		v, err := h.treeView(ctx, q)
		if err != nil {
			return "", false, err
		}
		return "fragment", false, h.tmpl.ExecuteTemplate(buf, "tree", v)
	}})
}
