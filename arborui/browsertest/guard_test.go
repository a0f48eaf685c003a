package browsertest

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestBrowserHostileConversationIDs: the page of a conversation whose id
// holds #, &, +, % or ? follows that conversation's own stream (a task
// created in it appears live; one created in "victim" does not), and its
// abort button acts on it and comes back to its page.
func TestBrowserHostileConversationIDs(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	suffix := testdb.Name("")
	victim := "victim" + suffix
	vroot, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: victim, Kind: "victim_turn"})
	require.NoError(t, err)
	b := browser(t)
	for _, id := range []string{victim + "#x", victim + "&id=" + victim, victim + "+x", victim + "%23", victim + "?id=" + victim} {
		root, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: id, Kind: "own_turn"})
		require.NoError(t, err)
		require.NoError(t, chromedp.Do(b,
			chromedp.Navigate(v.base+"/conversation?id="+url.QueryEscape(id)),
			chromedp.WaitVisible(fmt.Sprintf(`#task-%d`, root.ID)),
			chromedp.WaitVisible(`#live-status.on`),
		), "%q: the page", id)
		// A child in victim, then one in the page's conversation: the
		// second shows; the first never does.
		_, _, err = v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: victim, OwnerID: vroot.ID, Kind: "victim_child"})
		require.NoError(t, err)
		child, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: id, OwnerID: root.ID, Kind: "own_child"})
		require.NoError(t, err)
		require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#task-%d`, child.ID))), "%q: the live child", id)
		tree := text(t, b, `document.getElementById("tree").textContent`)
		require.NotContains(t, tree, "victim_")
		require.Contains(t, tree, "own_child")

		submit(t, b, fmt.Sprintf(`button[data-abort="%d"]`, root.ID))
		// Never started, it settles orphaned.
		require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-status="orphaned"]`, root.ID))), "%q: abort", id)
		loc, err := chromedp.Run(b, chromedp.Location())
		require.NoError(t, err)
		u, err := url.Parse(loc)
		require.NoError(t, err)
		require.Equal(t, id, u.Query().Get("id"), "back on the conversation's own page")
	}
	got, err := v.engine.Get(v.ctx, vroot.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "victim was not aborted")
}

// TestBrowserDNSRebinding: a page of evil.example whose name resolves to
// the view's address (Chromium's host resolver maps it to 127.0.0.1)
// reads nothing of the view, and its POST with a leaked token aborts
// nothing.
func TestBrowserDNSRebinding(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	task, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "turn"})
	require.NoError(t, err)
	b := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	// The token, as if it had leaked.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, task.ID)), chromedp.WaitVisible(`#abort`)))
	csrf := text(t, b, `document.querySelector('input[name="csrf"]').value`)
	require.NotEmpty(t, csrf)

	port := v.srv.URL[strings.LastIndex(v.srv.URL, ":")+1:]
	evil := "http://evil.example:" + port
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/arbor/tasks/%d", evil, task.ID))))
	body := text(t, b, `document.body.innerText`)
	require.Contains(t, body, "refused")
	require.NotContains(t, body, csrf)
	// The rebound page's own scripts: a read, and the abort.
	got, err := chromedp.Run(b, chromedp.Evaluate[string](fmt.Sprintf(`(async () => {
		const page = await fetch("/arbor/tasks/%[1]d");
		const post = await fetch("/arbor/tasks/%[1]d/abort", {method: "POST",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "csrf=%[2]s"});
		return page.status + " " + (await page.text()).includes(%[2]q) + " " + post.status;
	})()`, task.ID, csrf), chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, "403 false 403", got)
	after, err := v.engine.Get(v.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, after.Status, "nothing was aborted")
}

// TestBrowserOpenRedirect: a form whose back address was changed to
// "/\t/evil.example/" (which a browser reads as //evil.example/) brings
// the browser back to the task's page on the view, not to evil.example.
// The view is at the root, as arbor ui serves it.
func TestBrowserOpenRedirect(t *testing.T) {
	t.Parallel()
	v := newViewAt(t, "", &arborui.Options{Actions: true})
	task, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "turn"})
	require.NoError(t, err)
	b := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, task.ID)), chromedp.WaitVisible(`#abort`)))
	require.Equal(t, "/\t/evil.example/", text(t, b, "document.querySelector('#task-actions input[name=\"back\"]').value = '/\\t/evil.example/'"))
	submit(t, b, `#abort`)
	loc, err := chromedp.Run(b, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s/tasks/%d", v.base, task.ID), loc)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#status.status-orphaned`)))
}

// TestBrowserControlCharacters: ESC, C1 controls and bidirectional
// overrides in a task's fields show as symbols in the page, and reach
// neither its HTML nor its DOM raw.
func TestBrowserControlCharacters(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	evil := "x\x1b[2J\x1b]0;pwned\x07\u009b31m\u202eexe.txt"
	conv := "c\x1b[31m" + testdb.Conversation(t)
	input, _ := json.Marshal(map[string]string{"q": evil})
	task, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "k" + evil, Input: input})
	require.NoError(t, err)
	b := browser(t)
	for _, page := range []string{fmt.Sprintf("%s/tasks/%d", v.base, task.ID), v.base + "/conversation?id=" + url.QueryEscape(conv)} {
		require.NoError(t, chromedp.Do(b, chromedp.Navigate(page), chromedp.WaitVisible(`#live-status.on`)))
		html := text(t, b, `document.documentElement.outerHTML`)
		raw, err := chromedp.Run(b, chromedp.Evaluate[string](`fetch(location.href).then(r => r.text())`, chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		for _, s := range []string{html, raw} {
			for _, c := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
				require.NotContains(t, s, c, page)
			}
			require.Contains(t, s, "␛[2J", page)
			require.Contains(t, s, "[U+202E]", page)
		}
	}
}

// TestBrowserAnswerForm: with actions on, the page of a task awaiting an
// event shows its answer form, and answering it delivers the payload.
func TestBrowserAnswerForm(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	task, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "mail_agent"})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, task.ID)
	require.NoError(t, err)
	_, err = v.engine.AwaitEvent(v.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
	require.NoError(t, err)
	b := browser(t)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, task.ID)),
		chromedp.WaitVisible(`#answer`),
		chromedp.SendKeys(`#answer-payload`, `{"approved": true, "note": "<ok>"}`),
	))
	submit(t, b, `#answer`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#status.status-pending`)))
	got, err := v.engine.Get(v.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status)
	require.JSONEq(t, `{"approved": true, "note": "<ok>"}`, string(got.Delivered.Payload))
}

// TestBrowserAssetsNotListed: the assets' folder is no page.
func TestBrowserAssetsNotListed(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	b := browser(t)
	res, err := chromedp.Run(b, chromedp.NavigateResponse(v.base+"/assets/"))
	require.NoError(t, err)
	require.EqualValues(t, 404, res.Status)
	require.NotContains(t, text(t, b, `document.body.innerText`), "app.js")
}

// hostile is markup, quotes and controls, in every field the view
// renders.
const hostile = `<img src=x class=pwned onerror="window.pwned=1">"'><script class=pwned>window.pwned=1</script>` + "\x1b[31m\u202e"

// TestBrowserHostileStrings: a conversation whose id, tenant, kinds,
// concurrency key, phases, states, inputs, results, errors, events,
// awaits, trace headers and holder name are all hostile, and a
// concurrency limit and a tenant's weight of those names: every page that
// renders them (the list, the tree and its log, the task, the log page,
// the approvals, the nodes, the limits, the stats) shows them as text — no element of theirs in the DOM, no
// control character raw.
func TestBrowserHostileStrings(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true, TraceURL: "https://trace.example/{trace_id}"})
	conv := "conv" + hostile + testdb.Name("")
	traced, err := tasks.New(v.ctx, v.pool, &tasks.Config{Schema: v.schema, TraceInjector: fixedTrace{"traceparent": hostile, hostile: hostile}})
	require.NoError(t, err)
	doc := func(s string) json.RawMessage {
		out, err := json.Marshal(map[string]string{hostile: s})
		require.NoError(t, err)
		return out
	}
	root, _, err := traced.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn" + hostile, Input: doc(hostile),
		IdempotencyKey: "key" + hostile, MaxRetries: 1, Tenant: "tenant" + hostile, Priority: 30, ConcurrencyKey: "ckey" + hostile,
		QueueTTL: time.Hour})
	require.NoError(t, err)
	child, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "tool" + hostile})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, root.ID)
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, root.ID, run.Token, arbortype.TaskError{Code: "code" + hostile, Message: hostile, Detail: doc(hostile)})
	require.NoError(t, err)
	crun, err := v.engine.Start(v.ctx, child.ID)
	require.NoError(t, err)
	_, err = v.engine.AwaitEvent(v.ctx, child.ID, crun.Token, core.AwaitParams{Name: "approval" + hostile, Phase: "phase" + hostile, State: doc(hostile)})
	require.NoError(t, err)
	_, _, err = v.engine.Emit(v.ctx, tasks.EmitParams{ConversationID: conv, Name: "ev" + hostile, Payload: doc(hostile)})
	require.NoError(t, err)
	done, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv + "-2", Kind: "done" + hostile})
	require.NoError(t, err)
	drun, err := v.engine.Start(v.ctx, done.ID)
	require.NoError(t, err)
	_, err = v.engine.Complete(v.ctx, done.ID, drun.Token, doc(hostile))
	require.NoError(t, err)
	// The conversation handed to a node of a hostile name, as a take-over
	// does: the test's own lease released first (a take-over from a live
	// holder is refused).
	require.NoError(t, v.engine.ReleaseLease(v.ctx, conv+"-2"))
	var holder int64
	require.NoError(t, v.pool.QueryRow(v.ctx, `INSERT INTO `+v.schema+`.holders (name, expires_at) VALUES ($1, now() + interval '1 hour') RETURNING id`,
		"node"+hostile).Scan(&holder))
	v.exec(t, `UPDATE {schema}.conversations SET holder = $2, holder_id = $3, epoch = epoch + 1 WHERE id = $1`, conv+"-2", "node"+hostile, holder)

	require.NoError(t, v.engine.SetConcurrencyLimit(v.ctx, "key:ckey"+hostile, 5))
	require.NoError(t, v.engine.SetTenantWeight(v.ctx, "tenant"+hostile, 3))

	b := browser(t)
	for _, page := range []string{
		v.base + "/",
		v.base + "/?tenant=" + url.QueryEscape("tenant"+hostile),
		v.base + "/conversation?id=" + url.QueryEscape(conv),
		v.base + "/conversation/log?id=" + url.QueryEscape(conv),
		fmt.Sprintf("%s/tasks/%d", v.base, root.ID),
		fmt.Sprintf("%s/tasks/%d", v.base, child.ID),
		fmt.Sprintf("%s/tasks/%d", v.base, done.ID),
		v.base + "/approvals",
		v.base + "/nodes",
		v.base + "/limits",
		v.base + "/stats",
		v.base + "/stats?tenant=" + url.QueryEscape("tenant"+hostile),
	} {
		require.NoError(t, chromedp.Do(b, chromedp.Navigate(page), chromedp.WaitVisible(`main`)), page)
		if !strings.Contains(page, "/conversation/log") {
			require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#live-status.on`)), page)
		}
		require.Equal(t, "0", text(t, b, `String(document.querySelectorAll(".pwned, img, main script").length)`), page)
		require.Equal(t, "none", text(t, b, `String(window.pwned || "none")`), page)
		body := text(t, b, `document.body.innerText`)
		require.Contains(t, body, `<img src=x class=pwned`, "%s shows the markup as text", page)
		require.NotContains(t, text(t, b, `document.documentElement.outerHTML`), "\x1b", page)
	}
}
