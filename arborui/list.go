package arborui

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// The front page: every conversation, a page at a time, filtered, newest
// first (or by id), with the live tasks counted across conversations; live
// (it is rendered again when anything was logged since).

// listFilter is the front page's query, as its form and its links carry
// it.
type listFilter struct {
	Q        string // an id, or a prefix of ids
	Order    string // "" (recent) or "id"
	Live     string // "", "live" or "settled"
	Status   string // a live status
	Failed   bool
	Awaiting bool
	Holder   string
	Kind     string
	Age      string // "", "1h", "24h", "7d" or "older"
	Tenant   string // a tenant; "" any (the default tenant is not a filter)
	Cursor   string
}

// ages are the front page's choices of how old a conversation is.
var ages = []struct{ Value, Label string }{{"", "any age"}, {"1h", "created in the last hour"},
	{"24h", "in the last 24 hours"}, {"7d", "in the last 7 days"}, {"older", "more than 7 days ago"}}

func parseFilter(q url.Values) (listFilter, error) {
	f := listFilter{Q: q.Get("q"), Order: q.Get("order"), Live: q.Get("live"), Status: q.Get("status"),
		Failed: q.Get("failed") != "", Awaiting: q.Get("awaiting") != "", Holder: q.Get("holder"), Kind: q.Get("kind"),
		Age: q.Get("age"), Tenant: q.Get("tenant"), Cursor: q.Get("cursor")}
	switch {
	case f.Order != "" && f.Order != "id":
		return f, badRequest("order %q is not one of: recent (empty), id", f.Order)
	case f.Live != "" && f.Live != "live" && f.Live != "settled":
		return f, badRequest("live %q is not one of: live, settled", f.Live)
	case f.Status != "" && !arbortype.Status(f.Status).Live():
		return f, badRequest("status %q is not a live status", f.Status)
	case !slices.ContainsFunc(ages, func(a struct{ Value, Label string }) bool { return a.Value == f.Age }):
		return f, badRequest("age %q is not one of: 1h, 24h, 7d, older", f.Age)
	}
	return f, nil
}

// query is the engine's query of f, as of now.
func (f listFilter) query(limit, scan int, now time.Time) inspect.ConversationQuery {
	q := inspect.ConversationQuery{Order: inspect.ConversationOrder(f.Order), Cursor: f.Cursor, Limit: limit, Scan: scan,
		Prefix: f.Q, Holder: f.Holder, Failed: f.Failed, Awaiting: f.Awaiting, Kind: f.Kind}
	switch f.Live {
	case "live":
		q.Live = inspect.LiveOnly
	case "settled":
		q.Live = inspect.LiveNone
	}
	if f.Tenant != "" {
		q.Tenant = &f.Tenant
	}
	if f.Status != "" {
		q.Statuses = []arbortype.Status{arbortype.Status(f.Status)}
	}
	switch f.Age {
	case "1h":
		q.CreatedAfter = now.Add(-time.Hour)
	case "24h":
		q.CreatedAfter = now.Add(-24 * time.Hour)
	case "7d":
		q.CreatedAfter = now.Add(-7 * 24 * time.Hour)
	case "older":
		q.CreatedBefore = now.Add(-7 * 24 * time.Hour)
	}
	return q
}

// url is the address of path with f's query, cursor as given.
func (f listFilter) url(prefix, path, cursor string) string {
	return link(prefix, path, "q", f.Q, "order", f.Order, "live", f.Live, "status", f.Status, "failed", f.Failed,
		"awaiting", f.Awaiting, "holder", f.Holder, "kind", f.Kind, "age", f.Age, "tenant", f.Tenant, "cursor", cursor)
}

// Filtered says f filters anything (the cursor aside).
func (f listFilter) Filtered() bool {
	f.Cursor, f.Order = "", ""
	return f != listFilter{}
}

type listView struct {
	page
	F        listFilter
	Ages     any
	Statuses []arbortype.Status
	Counts   inspect.LiveTaskCounts
	// Exact is the conversation whose id is the search, if there is one.
	Exact *arbortype.Conversation
	Rows  []inspect.ConversationListing
	// Health is each listed conversation's queued turns and why it is
	// stuck, if it is.
	Health map[string]health
	Page   inspect.ConversationPage
	Now    time.Time
	// Next and First are the pager's addresses; Live the stream's; Back
	// the page's own (a bulk action's).
	Next, First, Live, Back string
}

func (h *handler) listView(ctx context.Context, f listFilter) (listView, error) {
	now := time.Now()
	v := listView{page: h.page("conversations", nil).in("conversations"), F: f, Ages: ages,
		Statuses: arbortype.LiveStatuses, Now: now}
	var err error
	if v.Counts, err = h.reader.LiveTaskCounts(ctx, 100_000); err != nil {
		return v, err
	}
	if f.Q != "" && f.Cursor == "" {
		c, err := h.engine.Conversation(ctx, f.Q)
		switch {
		case err == nil:
			v.Exact = &c
		case !errors.Is(err, arbortype.ErrNotFound) && !errors.Is(err, arbortype.ErrInvalidArgument):
			return v, err
		}
	}
	if v.Page, err = h.reader.QueryConversations(ctx, f.query(h.opts.RecentLimit, h.opts.ScanLimit, now)); err != nil {
		return v, err
	}
	v.Rows = v.Page.Conversations
	ids := make([]string, len(v.Rows))
	for i, r := range v.Rows {
		ids[i] = r.ID
	}
	states, err := h.conversationStates(ctx, ids)
	if err != nil {
		return v, err
	}
	v.Health = make(map[string]health, len(v.Rows))
	for _, r := range v.Rows {
		if s, ok := states[r.ID]; ok {
			v.Health[r.ID] = conversationHealth(r.ConversationSummary, s)
		}
	}
	if v.Page.Next != "" {
		v.Next = f.url(h.opts.Prefix, "/", v.Page.Next)
	}
	if f.Cursor != "" {
		v.First = f.url(h.opts.Prefix, "/", "")
	}
	v.Live = f.url(h.opts.Prefix, "/live", f.Cursor)
	v.Back = f.url(h.opts.Prefix, "/", f.Cursor)
	return v, nil
}

func (h *handler) index(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	v, err := h.listView(r.Context(), f)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.render(w, r, "index.html", v.page.with(v))
}

// indexLive streams the front page's list: again whenever anything was
// logged (the newest entry's seq moved), or every 15th refresh (leases
// and ages change without a log entry).
func (h *handler) indexLive(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.serve(w, r, stream{
		poll: h.logMoved(15),
		render: func(ctx context.Context, buf *bytes.Buffer) (string, bool, error) {
			v, err := h.listView(ctx, f)
			if err != nil {
				return "", false, err
			}
			return "fragment", false, h.tmpl.ExecuteTemplate(buf, "list", v)
		},
	})
}

// logMoved returns a poll that says yes when the newest log entry of any
// conversation changed since it last looked, and at least every every-th
// time.
func (h *handler) logMoved(every int) func(context.Context) (bool, error) {
	var seen int64 = -1
	n := 0
	return func(ctx context.Context) (bool, error) {
		seq, err := h.reader.LastLogSeq(ctx)
		if err != nil {
			return false, err
		}
		n++
		if seq == seen && n < every {
			return false, nil
		}
		seen, n = seq, 0
		return true, nil
	}
}
