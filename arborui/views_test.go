package arborui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

var hrefRe = regexp.MustCompile(`id="next" href="([^"]+)"|href="([^"]+)" id="next"`)

// nextLink is the address of a page's "next page" link (prefix
// stripped), or "".
func nextLink(t *testing.T, b *bundle, page string) string {
	t.Helper()
	m := hrefRe.FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return strings.TrimPrefix(html.UnescapeString(m[1]+m[2]), b.prefix)
}

// TestListPages: the front page lists every conversation a page at a
// time, each once, newest first; a filter keeps only what it names; a bad
// filter is 400.
func TestListPages(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{RecentLimit: 4, Prefix: "/arbor"})
	var ids []string
	for i := range 10 {
		id := fmt.Sprintf("%s-%02d", b.conv, i)
		ids = append(ids, id)
		b.create(t, arbortype.CreateParams{ConversationID: id, Kind: fmt.Sprintf("kind%d", i%2)})
	}
	seen := map[string]bool{}
	var order []string
	for path, pages := "/?q="+url.QueryEscape(b.conv), 0; path != ""; pages++ {
		require.Less(t, pages, 10)
		code, page := b.get(t, path)
		require.Equal(t, http.StatusOK, code, page)
		require.LessOrEqual(t, strings.Count(page, `<a class="id" href=`), 4, page)
		for _, m := range regexp.MustCompile(`<a class="id" href="[^"]*">([^<]+)</a>`).FindAllStringSubmatch(page, -1) {
			require.False(t, seen[m[1]], "%s listed twice", m[1])
			seen[m[1]] = true
			order = append(order, m[1])
		}
		path = nextLink(t, b, page)
	}
	require.Len(t, order, 10)
	require.Equal(t, ids[9], order[0], "newest first")

	_, page := b.get(t, "/?kind=kind1&order=id")
	require.Contains(t, page, ">"+ids[1]+"<")
	require.NotContains(t, page, ">"+ids[0]+"<")
	for _, bad := range []string{"/?order=x", "/?live=maybe", "/?status=completed", "/?age=1y", "/?cursor=zzz"} {
		code, _ := b.get(t, bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
}

// TestTreeIsPaged: a tree larger than Options.TreeLimit is drawn a page
// at a time, what a page leaves out counted, and its stream sends no
// more than a page: the fragment's size does not grow with the tree.
func TestTreeIsPaged(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{TreeLimit: 10})
	root := b.create(t, arbortype.CreateParams{Kind: "turn"})
	var ps []arbortype.CreateParams
	for range 3000 {
		ps = append(ps, arbortype.CreateParams{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool",
			Input: json.RawMessage(`{"q": "` + strings.Repeat("x", 1000) + `"}`)})
	}
	_, _, err := b.engine.CreateMany(b.ctx, ps)
	require.NoError(t, err)

	code, page := b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 10, strings.Count(page, `<li id="task-`))
	require.Contains(t, page, "3001 tasks")
	require.Contains(t, page, fmt.Sprintf(`data-more="%d">… 2991 more children`, root.ID))
	require.Regexp(t, `id="tree-next"`, page)

	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s := b.stream(t, ctx, "/conversation/live?id="+url.QueryEscape(b.conv)+"&after="+fmt.Sprint(root.ID+5))
	frag := s.next(t)
	require.Equal(t, 10, strings.Count(frag, `<li id="task-`))
	require.Contains(t, frag, fmt.Sprintf(`under <a href="/tasks/%d">#%d</a>`, root.ID, root.ID))
	require.Less(t, len(frag), 32<<10, "a page, not the tree (nor its inputs)")
	b.create(t, arbortype.CreateParams{OwnerID: root.ID, Kind: "late"})
	frag = s.next(t)
	require.Equal(t, 10, strings.Count(frag, `<li id="task-`))
	require.Contains(t, frag, "3002 tasks")
}

// TestLogStream: the log beside a tree streams only what comes after the
// page, each batch an "append" of rows newest first, payloads cut.
func TestLogStream(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	root := b.create(t, arbortype.CreateParams{Kind: "turn"})
	code, page := b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code)
	m := regexp.MustCompile(`data-live="(/conversation/log/live\?[^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, m, "the log's stream")
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s := b.stream(t, ctx, html.UnescapeString(m[1]))

	_, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "big", Payload: json.RawMessage(`"` + strings.Repeat("y", 5000) + `"`)})
	require.NoError(t, err)
	name, rows := s.nextEvent(t)
	require.Equal(t, "append", name)
	require.Equal(t, 1, strings.Count(rows, `<li class="entry`), "only the new entry: %s", rows)
	require.Contains(t, rows, "cut)")
	require.Less(t, len(rows), 4000)

	run, err := b.engine.Start(b.ctx, root.ID)
	require.NoError(t, err)
	_, err = b.engine.Recover(b.ctx, root.ID)
	require.NoError(t, err)
	for !strings.Contains(rows, "requeued") {
		name, rows = s.nextEvent(t)
		require.Equal(t, "append", name)
	}
	_ = run
}

// TestRecord: a task's page shows its attempts and their errors, its
// checkpoint, the events it received, its budgets and spend, and its
// trace id linked to the tracing UI.
func TestRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{TraceURL: "https://trace.example/t/{trace_id}?from=arbor"})
	traced := "0af7651916cd43dd8448eb211c80319c"
	task := b.create(t, arbortype.CreateParams{Kind: "turn", MaxRetries: 3})
	_, err := b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens", Max: 1000})
	require.NoError(t, err)
	run, err := b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: task.ID, Token: run.Token,
		Counter: "tokens", Amount: 42, Key: "k", Spend: true})
	require.NoError(t, err)
	_, err = b.engine.Checkpoint(b.ctx, task.ID, run.Token, "drafting", json.RawMessage(`{"draft": "<b>hi</b>"}`))
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, task.ID, run.Token, arbortype.TaskError{Code: "tool_timeout", Message: "the tool took too long"})
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "nudge", Payload: json.RawMessage(`{"n": 7}`)})
	require.NoError(t, err)
	traceTask := b.createTraced(t, "00-"+traced+"-b7ad6b7169203331-01")
	code, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Equal(t, http.StatusOK, code, page)
	hist := page[strings.Index(page, `id="error-history"`):]
	require.Contains(t, hist, "tool_timeout")
	require.Contains(t, hist, "the tool took too long")
	require.Contains(t, page, `id="phase">drafting<`)
	require.Contains(t, page, "&lt;b&gt;hi&lt;/b&gt;")
	ev := page[strings.Index(page, `id="events"`):]
	require.Contains(t, ev, "nudge")
	require.Contains(t, ev, "&#34;n&#34;: 7")
	bud := page[strings.Index(page, `id="budget"`):]
	require.Contains(t, bud, "<td>conversation</td><td>tokens</td><td>42</td>")
	require.Contains(t, bud, "<td>this task itself</td><td>tokens</td><td>42</td>")
	require.Contains(t, page, `id="trace"><span class="muted">none</span>`)

	_, page = b.get(t, fmt.Sprintf("/tasks/%d", traceTask.ID))
	require.Contains(t, page, `href="https://trace.example/t/`+traced+`?from=arbor" id="trace-link"`)
}

// TestHostileTrace: a trace context that is not a W3C traceparent is
// shown as text and linked to nothing.
func TestHostileTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{TraceURL: "https://trace.example/t/{trace_id}"})
	for _, tp := range []string{`00-"><script>alert(1)</script>-b7ad6b7169203331-01`, "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"javascript:alert(1)", "00-0af7651916cd43dd8448eb211c80319c/../x-b7ad6b7169203331-01"} {
		task := b.createTraced(t, tp)
		_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
		require.NotContains(t, page, "trace-link", tp)
		require.NotContains(t, page, "<script>alert", tp)
	}
}

// TestBigDocuments: a document over 64 KiB is shown cut, with a link to
// the whole of it, which is served as JSON with the controls escaped.
func TestBigDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	big := `{"text": "` + strings.Repeat("z", 100_000) + "\u009b" + `"}`
	task := b.create(t, arbortype.CreateParams{Kind: "turn", Input: json.RawMessage(big)})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Less(t, len(page), 80<<10)
	require.Contains(t, page, fmt.Sprintf(`href="/tasks/%d/doc/input">the whole document`, task.ID))
	res, err := b.client.Get(b.url(fmt.Sprintf("/tasks/%d/doc/input", task.ID)))
	require.NoError(t, err)
	defer res.Body.Close()
	var got map[string]string
	require.NoError(t, json.NewDecoder(res.Body).Decode(&got))
	require.Equal(t, strings.Repeat("z", 100_000)+"\u009b", got["text"])
	require.Equal(t, "application/json; charset=utf-8", res.Header.Get("Content-Type"))
	code, _ := b.get(t, fmt.Sprintf("/tasks/%d/doc/secret", task.ID))
	require.Equal(t, http.StatusNotFound, code)
}

// TestApprovals: the approvals page lists the awaits of every
// conversation; approve and deny answer each through its own token, with
// the payload and "approved"; an answer to an await that is over is 409,
// saying so, and writes nothing; read-only, no form and no token.
func TestApprovals(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	await := func(conv string) arbortype.Task {
		task := b.create(t, arbortype.CreateParams{ConversationID: conv, Kind: "mail_agent"})
		run, err := b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		res, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "ask"})
		require.NoError(t, err)
		return res.Task
	}
	yes, no := await(b.conv+"-a"), await(b.conv+"-b")
	code, page := b.get(t, "/approvals")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, fmt.Sprintf(`id="await-%d"`, yes.ID))
	require.Contains(t, page, fmt.Sprintf(`id="await-%d"`, no.ID))
	require.Contains(t, page, `value="`+yes.AwaitToken+`"`)
	csrf := token(t, page)
	// The conversation's tree says what it awaits, not that it sleeps.
	code, tree := b.get(t, "/conversation?id="+url.QueryEscape(b.conv+"-a"))
	require.Equal(t, http.StatusOK, code, tree)
	require.Contains(t, tree, `<span class="badge status-awaiting">awaiting approval</span>`)

	code, _, to := b.post(t, fmt.Sprintf("/tasks/%d/emit", yes.ID), url.Values{"csrf": {csrf}, "token": {yes.AwaitToken},
		"decision": {"approve"}, "payload": {`{"note": "<ok>"}`}, "back": {"/approvals"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/approvals", to)
	got, err := b.engine.Get(b.ctx, yes.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": true, "note": "<ok>"}`, string(got.Delivered.Payload))

	code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", no.ID), url.Values{"csrf": {csrf}, "token": {no.AwaitToken},
		"decision": {"deny"}, "payload": {`[1]`}}, nil)
	require.Equal(t, http.StatusBadRequest, code, "a payload that is not an object")
	require.Contains(t, body, "must be a JSON object")
	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/emit", no.ID), url.Values{"csrf": {csrf}, "token": {no.AwaitToken}, "decision": {"deny"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	got, err = b.engine.Get(b.ctx, no.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": false}`, string(got.Delivered.Payload))

	// The page left open: its forms answer awaits that are over.
	code, body, _ = b.post(t, fmt.Sprintf("/tasks/%d/emit", yes.ID), url.Values{"csrf": {csrf}, "token": {yes.AwaitToken}, "decision": {"deny"}}, nil)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, body, "This await was answered already")
	require.Contains(t, body, "nothing was written")
	got, err = b.engine.Get(b.ctx, yes.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": true, "note": "<ok>"}`, string(got.Delivered.Payload), "the first answer stands")
	_, page = b.get(t, "/approvals")
	require.Contains(t, page, "Nothing awaits an answer")

	ro := setup(t, nil)
	task := ro.create(t, arbortype.CreateParams{Kind: "mail_agent"})
	run, err := ro.engine.Start(ro.ctx, task.ID)
	require.NoError(t, err)
	res, err := ro.engine.AwaitEvent(ro.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	_, page = ro.get(t, "/approvals")
	require.Contains(t, page, fmt.Sprintf(`id="await-%d"`, task.ID))
	require.NotContains(t, page, res.Task.AwaitToken)
	require.NotContains(t, page, "<form class=\"inline answer\"")
}

// TestNodes: the nodes page shows each holder's lives, the conversations
// they hold, and those a lapsed life still names; and the restarts.
func TestNodes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, err := b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	_, err = b.engine.Recover(b.ctx, task.ID)
	require.NoError(t, err)
	code, page := b.get(t, "/nodes")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `data-holder="test"`)
	require.Contains(t, page, "live, expires in")
	require.Contains(t, page, `href="/?holder=test&amp;order=id">1</a>`)
	restarts := page[strings.Index(page, `id="restarts"`):]
	require.Contains(t, restarts, fmt.Sprintf(`href="/tasks/%d"`, task.ID))
	require.Contains(t, restarts, "1 of 5")

	// (The holders' guard refuses a deadline brought back: the test
	// writes it with the triggers off, a superuser's replica role.)
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `UPDATE `+b.schema+`.holders SET expires_at = now() - interval '1 minute'`)
		return err
	})
	require.NoError(t, err)
	_, page = b.get(t, "/nodes")
	require.Contains(t, page, "1 lapsed, awaiting a take-over")
	require.Contains(t, page, "expired")
}

// TestOptionsOfTheViews: the views' options are validated, naming the
// field.
func TestOptionsOfTheViews(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, o := range []arborui.Options{{TraceURL: "ftp://x/{trace_id}"}, {TraceURL: "https://x/"}, {TraceURL: "/rel/{trace_id}"},
		{TreeLimit: 5001}, {ScanLimit: 10}, {Refresh: time.Hour}, {AllowedHosts: []string{"a/b"}}, {AllowedHosts: []string{""}}} {
		_, err := arborui.NewHandler(b.engine.Engine, &o)
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%+v", o)
		require.Contains(t, err.Error(), "Options.")
	}
}
