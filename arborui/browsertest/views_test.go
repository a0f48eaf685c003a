package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// The DOM bounds the 100,000 tests assert: a page of the list or of a
// tree is what a screen shows, not what the database holds.
const (
	maxElements  = 8000
	maxHTMLBytes = 512 << 10
)

// TestBrowserList100k: the front page over 100,000 conversations is a
// page of them: its DOM is bounded, the next pages follow, a filter and a
// search by id find theirs, and a new conversation shows on the first
// page without a reload.
func TestBrowserList100k(t *testing.T) {
	// Not parallel: the 100,000 rows and their pages would load the
	// machine while TestBrowser measures a change's latency.
	v := newView(t, &arborui.Options{Actions: true})
	prefix := testdb.Name("c")
	// Setup only: bulk SQL (every row through the guard triggers, as
	// pending inserts), then a failed conversation by the engine.
	v.exec(t, `INSERT INTO {schema}.conversations (id) SELECT $1 || '-' || lpad(i::text, 6, '0') FROM generate_series(1, 100000) i`, prefix)
	v.exec(t, `INSERT INTO {schema}.tasks (conversation_id, kind) SELECT $1 || '-' || lpad(i::text, 6, '0'), 'turn' FROM generate_series(1, 100000) i`, prefix)
	v.exec(t, `ANALYZE {schema}.conversations; ANALYZE {schema}.tasks`)
	failed := prefix + "-050000"
	var fid int64
	require.NoError(t, v.pool.QueryRow(v.ctx, `SELECT id FROM `+v.schema+`.tasks WHERE conversation_id = $1`, failed).Scan(&fid))
	run, err := v.engine.Start(v.ctx, fid)
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, fid, run.Token, arbortype.TaskError{Code: "boom", Message: "the tool failed", NonRetryable: true})
	require.NoError(t, err)

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/"), chromedp.WaitVisible(`#conversations`), chromedp.WaitVisible(`#live-status.on`)))
	els, size := domSize(t, b)
	t.Logf("the front page over 100,000 conversations: %d elements, %d bytes of HTML", els, size)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)
	first := text(t, b, `document.querySelector("#conversations tbody tr a.id").textContent`)
	require.Equal(t, prefix+"-100000", first, "newest first")
	for page := 2; page <= 3; page++ {
		submit(t, b, `#next`)
		require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#conversations`)))
		got := text(t, b, `document.querySelector("#conversations tbody tr a.id").textContent`)
		require.Equal(t, fmt.Sprintf("%s-%06d", prefix, 100000-50*(page-1)), got, "page %d", page)
	}
	els, size = domSize(t, b)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)

	// By id, from the middle.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/?order=id&q="+url.QueryEscape(prefix+"-0999")), chromedp.WaitVisible(`#conversations`)))
	require.Equal(t, prefix+"-099900", text(t, b, `document.querySelector("#conversations tbody tr a.id").textContent`))
	// A search by an exact id offers it.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/?q="+url.QueryEscape(failed)), chromedp.WaitVisible(`#exact`)))
	// Has failed: the one conversation, though 50,000 newer ones come first
	// (partial pages read on).
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/"), chromedp.WaitVisible(`#filters`), clickLive(`input[name="failed"]`)))
	submit(t, b, `#filter`)
	for range 20 {
		if n := text(t, b, `String(document.querySelectorAll("#conversations tbody tr").length)`); n == "1" {
			break
		}
		require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#partial`)))
		submit(t, b, `#next`)
	}
	require.Equal(t, failed, text(t, b, `document.querySelector("#conversations tbody tr a.id").textContent`))
	require.Contains(t, text(t, b, `document.querySelector("#conversations tbody tr").textContent`), "failed")

	// Live: a new conversation shows on the first page.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/"), chromedp.WaitVisible(`#conversations`), chromedp.WaitVisible(`#live-status.on`)))
	_, _, err = v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: prefix + "-new", Kind: "fresh_turn"})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#conversations a.id[href$=%q]`, url.QueryEscape(prefix+"-new")))))

	// The first page's two newest, ticked and aborted in bulk.
	for _, id := range []string{prefix + "-new", prefix + "-100000"} {
		_, err := chromedp.Run(b, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector('#conversations input[data-select][value=%q]').click() || true`, id)))
		require.NoError(t, err)
	}
	submit(t, b, `#bulk-abort`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#conversations`)))
	for _, id := range []string{prefix + "-new", prefix + "-100000"} {
		all, err := v.engine.ConversationTasks(v.ctx, id)
		require.NoError(t, err)
		require.True(t, all[0].Status.Settled(), id)
	}

	// The stats over 100,000 turns pending: bounded counts, said so.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/stats"), chromedp.WaitVisible(`#tenant-stats`), chromedp.WaitVisible(`#live-status.on`)))
	require.Contains(t, text(t, b, `document.querySelector("#tenant-stats tbody tr").textContent`), "10000+")
	els, size = domSize(t, b)
	t.Logf("the stats page over 100,000 conversations: %d elements, %d bytes of HTML", els, size)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)
}

// TestBrowserTree100k: a conversation of 100,000 tasks draws a page of
// its tree, with its DOM bounded; the next page follows; a change shows
// without a reload, in the tree (the counts) and in the log beside it.
func TestBrowserTree100k(t *testing.T) {
	// Not parallel: the 100,000 rows and their pages would load the
	// machine while TestBrowser measures a change's latency.
	v := newView(t, &arborui.Options{Actions: true})
	conv := testdb.Conversation(t)
	root, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	v.exec(t, `INSERT INTO {schema}.tasks (conversation_id, owner_task_id, kind) SELECT $1, $2, 'tool' FROM generate_series(1, 99999)`, conv, root.ID)
	v.exec(t, `ANALYZE {schema}.tasks`)

	b := browser(t)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(v.base+"/conversation?id="+url.QueryEscape(conv)),
		chromedp.WaitVisible(fmt.Sprintf(`#task-%d`, root.ID)),
		chromedp.WaitVisible(`#live-status.on`),
	))
	els, size := domSize(t, b)
	t.Logf("the page of a 100,000-task tree: %d elements, %d bytes of HTML", els, size)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)
	require.Contains(t, text(t, b, `document.getElementById("summary").textContent`), "100000 tasks")
	require.Contains(t, text(t, b, fmt.Sprintf(`document.querySelector('[data-more="%d"]').textContent`, root.ID)), "99500 more children")
	require.Equal(t, "500", text(t, b, `String(document.querySelectorAll("#tree li[id^=task-]").length)`))

	// A change: the page shows it without a reload, the log too.
	_, err = chromedp.Run(b, chromedp.Evaluate[string](`window.arborMark = "same page"`))
	require.NoError(t, err)
	late, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "late_tool"})
	require.NoError(t, err)
	until(t, b, `document.getElementById("summary").textContent.includes("100001 tasks")`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#log a[href$="/tasks/%d"]`, late.ID))))
	require.Equal(t, "same page", text(t, b, `window.arborMark`))

	submit(t, b, `#tree-next`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#tree-first`)))
	require.Contains(t, text(t, b, `document.getElementById("tree").textContent`), fmt.Sprintf("under #%d", root.ID))
	els, size = domSize(t, b)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)

	// The turn's page: its durations, and a timeline of it and the first
	// page of its 100,000 children.
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, root.ID)), chromedp.WaitVisible(`#timeline`),
		chromedp.WaitVisible(`#durations`), chromedp.WaitVisible(`#live-status.on`)))
	require.Equal(t, "51", text(t, b, `String(document.querySelectorAll("#timeline tr[data-timeline]").length)`))
	els, size = domSize(t, b)
	t.Logf("the page of a turn of 100,000 tasks: %d elements, %d bytes of HTML", els, size)
	require.Less(t, els, maxElements)
	require.Less(t, size, maxHTMLBytes)
}

// TestBrowserTaskPage: a task's page shows its attempts and their errors,
// its checkpoint, the events it received, its budgets and spend, its
// trace linked to the tracing UI and its log; and an event it receives
// shows without a reload.
func TestBrowserTaskPage(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{TraceURL: "https://tracing.example/trace/{trace_id}"})
	conv := testdb.Conversation(t)
	traced, err := tasks.New(v.ctx, v.pool, &tasks.Config{Schema: v.schema,
		TraceInjector: fixedTrace{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
	require.NoError(t, err)
	task, _, err := traced.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "agent", MaxRetries: 2})
	require.NoError(t, err)
	_, err = v.engine.SetBudget(v.ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 5000})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, task.ID)
	require.NoError(t, err)
	_, err = v.engine.C.ReserveBudget(v.ctx, core.ReserveParams{ConversationID: conv, TaskID: task.ID, Token: run.Token,
		Counter: "tokens", Amount: 1234, Key: "call-1", Spend: true})
	require.NoError(t, err)
	_, err = v.engine.Checkpoint(v.ctx, task.ID, run.Token, "drafting", json.RawMessage(`{"draft": "Dear Ana"}`))
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, task.ID, run.Token, arbortype.TaskError{Code: "rate_limited", Message: "429 from the model"})
	require.NoError(t, err)

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, task.ID)), chromedp.WaitVisible(`#live-status.on`)))
	require.Contains(t, text(t, b, `document.getElementById("error-history").textContent`), "429 from the model")
	require.Equal(t, "drafting", text(t, b, `document.getElementById("phase").textContent`))
	require.Contains(t, text(t, b, `document.getElementById("state").textContent`), "Dear Ana")
	require.Contains(t, text(t, b, `document.getElementById("budget").textContent`), "1234")
	require.Equal(t, "https://tracing.example/trace/4bf92f3577b34da6a3ce929d0e0e4736",
		text(t, b, `document.getElementById("trace-link").href`))
	require.Contains(t, text(t, b, `document.getElementById("task-log").textContent`), "sleeping")
	require.Contains(t, text(t, b, `document.getElementById("events").textContent`), "none")

	_, _, err = v.engine.Emit(v.ctx, tasks.EmitParams{ConversationID: conv, TaskID: task.ID, Name: "user_message", Payload: json.RawMessage(`{"text": "hurry"}`)})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`table#events`)))
	require.Contains(t, text(t, b, `document.getElementById("events").textContent`), "hurry")
}

// TestBrowserLogStream: the log beside a tree adds each new entry at its
// top without a reload, and keeps no more than 100.
func TestBrowserLogStream(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	conv := testdb.Conversation(t)
	_, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/conversation?id="+url.QueryEscape(conv)), chromedp.WaitVisible(`#live-status.on`)))
	for i := range 150 {
		_, _, err := v.engine.Emit(v.ctx, tasks.EmitParams{ConversationID: conv, Name: fmt.Sprintf("ev%03d", i), Queue: true})
		require.NoError(t, err)
	}
	until(t, b, `(document.querySelector("#log li .name") || {}).textContent === "ev149"`)
	n := text(t, b, `String(document.getElementById("log").children.length)`)
	require.Equal(t, "100", n, "the log keeps its last 100")
}

// awaitApproval creates a task in conv, starts it and parks it in an
// await of "approval" (an hour's timeout).
func awaitApproval(t *testing.T, v *view, conv string) arbortype.Task {
	t.Helper()
	task, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "mail_agent"})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, task.ID)
	require.NoError(t, err)
	res, err := v.engine.AwaitEvent(v.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "ask", Timeout: time.Hour})
	require.NoError(t, err)
	return res.Task
}

// TestBrowserTypedAnswerSurvivesAnUpdate: what a user typed into an
// approval's payload stays there, with the focus, when the live list is
// replaced because another await came in, and it is what the approval
// sends.
func TestBrowserTypedAnswerSurvivesAnUpdate(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	a := awaitApproval(t, v, testdb.Conversation(t))
	b := browser(t)
	field := fmt.Sprintf(`input[data-payload="%d"]`, a.ID)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(v.base+"/approvals"),
		chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, a.ID)),
		chromedp.WaitVisible(`#live-status.on`),
		chromedp.SendKeys(field, `{"note": "keep me"}`),
	))
	before := text(t, b, `document.getElementById("awaits").dataset.updated || ""`)
	later := awaitApproval(t, v, testdb.Conversation(t))
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, later.ID))))
	require.NotEqual(t, before, text(t, b, `document.getElementById("awaits").dataset.updated || ""`), "the list was replaced")
	require.Equal(t, `{"note": "keep me"}`, text(t, b, fmt.Sprintf(`document.querySelector(%q).value`, field)))
	require.Equal(t, "true", text(t, b, fmt.Sprintf(`String(document.activeElement === document.querySelector(%q))`, field)), "the field keeps the focus")
	submit(t, b, fmt.Sprintf(`button[data-approve="%d"]`, a.ID))
	require.NoError(t, chromedp.Do(b, chromedp.WaitNotPresent(fmt.Sprintf(`#await-%d`, a.ID))))
	got, err := v.engine.Get(v.ctx, a.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": true, "note": "keep me"}`, string(got.Delivered.Payload))
}

// TestBrowserApprovals: the approvals page lists the awaits of every
// conversation and answers one (approve, with a payload) from the page;
// the answer form of a task's page left open after its await ended says
// so (409) and sends nothing.
func TestBrowserApprovals(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	a, other := awaitApproval(t, v, testdb.Conversation(t)), awaitApproval(t, v, testdb.Conversation(t))
	b := browser(t)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(v.base+"/approvals"),
		chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, a.ID)),
		chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, other.ID)),
		chromedp.WaitVisible(`#live-status.on`),
		chromedp.SendKeys(fmt.Sprintf(`input[data-payload="%d"]`, a.ID), `{"note": "send it"}`),
	))
	submit(t, b, fmt.Sprintf(`button[data-approve="%d"]`, a.ID))
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, other.ID)), chromedp.WaitNotPresent(fmt.Sprintf(`#await-%d`, a.ID))))
	got, err := v.engine.Get(v.ctx, a.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": true, "note": "send it"}`, string(got.Delivered.Payload))

	// The other's page, left open while its await ends (woken, and parked
	// again: a new await with a new token).
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, other.ID)), chromedp.WaitVisible(`#answer`)))
	_, err = v.engine.WakeNow(v.ctx, other.ID)
	require.NoError(t, err)
	again := await2(t, v, other.ID)
	require.NoError(t, chromedp.Do(b, chromedp.SendKeys(`#answer-payload`, `{"approved": true}`)))
	submit(t, b, `#answer`)
	require.Contains(t, text(t, b, `document.getElementById("error").textContent`), "This await is over")
	require.Contains(t, text(t, b, `document.querySelector("h1").textContent`), "409")
	got, err = v.engine.Get(v.ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusSleeping, got.Status, "the new await is not answered")
	require.Equal(t, again.AwaitToken, got.AwaitToken)
}

// await2 parks task id, woken, in a new await.
func await2(t *testing.T, v *view, id int64) arbortype.Task {
	t.Helper()
	run, err := v.engine.Start(v.ctx, id)
	require.NoError(t, err)
	res, err := v.engine.AwaitEvent(v.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "ask"})
	require.NoError(t, err)
	return res.Task
}

// TestBrowserNodes: the nodes page shows a runner's node holding the
// conversation it runs, its lease renewed (the page is live: the age
// moves), and links to the conversations it holds.
func TestBrowserNodes(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	release := make(chan struct{})
	runner, err := machine.NewRunner(v.engine.Engine, map[string]machine.Handler{
		"long_turn": func(ctx context.Context, run *machine.Run) error {
			select {
			case <-release:
				return run.Complete(ctx, nil)
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	}, &machine.RunnerConfig{NodeID: "node-a"})
	require.NoError(t, err)
	require.NoError(t, runner.Start(v.ctx))
	t.Cleanup(func() {
		close(release)
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, runner.Stop(sctx))
	})
	conv := testdb.Conversation(t)
	_, _, err = v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "long_turn"})
	require.NoError(t, err)
	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/nodes"), chromedp.WaitVisible(`#live-status.on`)))
	until(t, b, `!!document.querySelector('[data-holder^="node-a"]')`)
	row := text(t, b, `document.querySelector('[data-holder^="node-a"]').textContent`)
	require.Contains(t, row, "live, expires in")
	until(t, b, `document.querySelector('[data-holder^="node-a"] a').textContent === "1"`)
	submit(t, b, `[data-holder^="node-a"] a`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#conversations a.id[href$=%q]`, url.QueryEscape(conv)))))
}

// TestBrowserActions: every action of the pages, clicked: a task's wake,
// emit, cancel and rerun, a conversation's emit and abort, an approval's deny;
// each lands in the database and shows in the page it comes back to.
func TestBrowserActions(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	conv := testdb.Conversation(t)
	sleeper, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "sleeper"})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, sleeper.ID)
	require.NoError(t, err)
	_, err = v.engine.SleepUntil(v.ctx, sleeper.ID, run.Token, time.Now().Add(time.Hour), "napping", nil)
	require.NoError(t, err)
	b := browser(t)
	task := fmt.Sprintf("%s/tasks/%d", v.base, sleeper.ID)

	require.NoError(t, chromedp.Do(b, chromedp.Navigate(task), chromedp.WaitVisible(`#status.status-sleeping`)))
	submit(t, b, `#wake`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#status.status-pending`)))
	require.NoError(t, chromedp.Do(b,
		chromedp.SendKeys(`#task-actions input[name="name"]`, "nudge"),
		chromedp.SendKeys(`#task-actions input[name="payload"]`, `{"why": "<now>"}`),
	))
	submit(t, b, `#emit`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`table#events`)))
	require.Contains(t, text(t, b, `document.getElementById("events").textContent`), `"why": "<now>"`)
	require.NoError(t, chromedp.Do(b, chromedp.SendKeys(`#task-actions input[name="result"]`, `{"by": "operator"}`)))
	submit(t, b, `#cancel`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#status.status-cancelled`)))
	got, err := v.engine.Get(v.ctx, sleeper.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCancelled, got.Status)
	require.JSONEq(t, `{"by": "operator"}`, string(got.Result))
	// A cancelled task is rerun from its checkpoint: the browser lands on
	// the new task's page, which names its source.
	submit(t, b, `#rerun`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#rerun-of`)))
	require.Contains(t, text(t, b, `document.getElementById("rerun-of").textContent`), fmt.Sprintf("#%d", sleeper.ID))
	all, err := v.engine.ConversationTasks(v.ctx, conv)
	require.NoError(t, err)
	rerun := all[len(all)-1]
	require.Equal(t, sleeper.ID, rerun.RerunOf)
	require.Equal(t, "napping", rerun.Phase, "from its checkpoint")

	other, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "next_turn"})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(v.base+"/conversation?id="+url.QueryEscape(conv)),
		chromedp.WaitVisible(`#live-status.on`),
		chromedp.SendKeys(`#conversation-actions input[name="name"]`, "user_message"),
		chromedp.SendKeys(`#conversation-actions input[name="payload"]`, `{"text": "stop"}`),
	))
	submit(t, b, `#emit-conversation`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#log .kind-event`)))
	require.Contains(t, text(t, b, `document.querySelector("#log .kind-event").textContent`), "user_message")
	require.NoError(t, chromedp.Do(b, chromedp.SendKeys(`#conversation-actions input[name="reason"]`, "operator stop")))
	submit(t, b, `#abort-conversation`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-status="orphaned"]`, other.ID))))
	loc, err := chromedp.Run(b, chromedp.Location())
	require.NoError(t, err)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, conv, u.Query().Get("id"))

	asker, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "asker"})
	require.NoError(t, err)
	arun, err := v.engine.Start(v.ctx, asker.ID)
	require.NoError(t, err)
	_, err = v.engine.AwaitEvent(v.ctx, asker.ID, arun.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/approvals"), chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, asker.ID))))
	submit(t, b, fmt.Sprintf(`button[data-deny="%d"]`, asker.ID))
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#none`)))
	got, err = v.engine.Get(v.ctx, asker.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"approved": false}`, string(got.Delivered.Payload))
}

// TestBrowserLimits: the limits page is live: a concurrency limit's
// running count follows a runner that starts a task of its key, and the
// limit shows full; a tenant's weight links to the list of its
// conversations.
func TestBrowserLimits(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	require.NoError(t, v.engine.SetConcurrencyLimit(v.ctx, "kind:long_turn", 1))
	require.NoError(t, v.engine.SetTenantWeight(v.ctx, "acme", 4))
	conv := testdb.Conversation(t)
	_, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "long_turn", Tenant: "acme"})
	require.NoError(t, err)

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/limits"), chromedp.WaitVisible(`#live-status.on`)))
	require.Contains(t, text(t, b, `document.querySelector('[data-key="kind:long_turn"]').textContent`), "0")

	release := make(chan struct{})
	runner, err := machine.NewRunner(v.engine.Engine, map[string]machine.Handler{
		"long_turn": func(ctx context.Context, run *machine.Run) error {
			select {
			case <-release:
				return run.Complete(ctx, nil)
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	}, &machine.RunnerConfig{NodeID: "node-l"})
	require.NoError(t, err)
	require.NoError(t, runner.Start(v.ctx))
	t.Cleanup(func() {
		close(release)
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, runner.Stop(sctx))
	})
	until(t, b, `!!document.querySelector('[data-key="kind:long_turn"] .flag')`)
	require.Contains(t, text(t, b, `document.querySelector('[data-key="kind:long_turn"]').textContent`), "1 full")
	submit(t, b, `#tenant-table a`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(fmt.Sprintf(`#conversations a.id[href$=%q]`, url.QueryEscape(conv)))))
	require.Contains(t, text(t, b, `document.querySelector('#conversations a.tenant').textContent`), "acme")
}

// TestBrowserSchedules: the schedules page, reached from the navigation,
// lists the schedules with their state; a hostile name is shown as text
// and runs nothing.
func TestBrowserSchedules(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	hostile := `<img src=x onerror="document.title='pwned'">`
	_, err := v.engine.CreateSchedule(v.ctx, arbortype.ScheduleParams{Name: "nightly", Kind: "digest", Cron: "0 2 * * *", TimeZone: "Europe/Paris"})
	require.NoError(t, err)
	_, err = v.engine.CreateSchedule(v.ctx, arbortype.ScheduleParams{Name: hostile, Kind: "poll", Every: time.Minute, ConversationID: hostile})
	require.NoError(t, err)
	_, err = v.engine.PauseSchedule(v.ctx, hostile)
	require.NoError(t, err)
	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/nodes"), chromedp.WaitVisible(`#nav-schedules`)))
	submit(t, b, `#nav-schedules`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#schedule-table`)))
	require.Equal(t, "here", text(t, b, `document.querySelector("#nav-schedules").className`))
	require.Equal(t, hostile, text(t, b, `document.querySelectorAll("#schedule-table tbody tr")[0].querySelector("td.id").textContent`))
	require.Contains(t, text(t, b, `document.querySelectorAll("#schedule-table tbody tr")[0].textContent`), "paused")
	row := text(t, b, `document.querySelector('[data-schedule="nightly"]').textContent`)
	require.Contains(t, row, "0 2 * * *")
	require.Contains(t, row, "Europe/Paris")
	require.Contains(t, row, "a new one per tick")
	require.Equal(t, "0", text(t, b, `String(document.querySelectorAll("#schedule-table img").length)`))
	require.NotEqual(t, "pwned", text(t, b, `document.title`))
}
