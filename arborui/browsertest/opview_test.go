package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
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

// The operator's view (issue 41): queued and stuck, failed turns,
// durations and a timeline, a budget park and its raise, an approval's
// context, the stats and the bulk actions, in Chromium, with markup
// strings in the fields a user or a model writes.

// markup is text that would run, or break a page, were it not escaped
// (guard_test.go's hostile adds control characters, which the view
// replaces: these tests compare what they wrote with what shows).
const markup = `<img src=x onerror="document.title='pwned'">&amp;'"`

// screenshot writes the tab's page as name (a PNG) into
// $ARBOR_UI_SCREENSHOTS when it is set (make browser
// ARBOR_UI_SCREENSHOTS=$PWD/docs refreshes docs/ui.md's), else into the
// test's temporary folder.
func screenshot(t *testing.T, b context.Context, name string) {
	t.Helper()
	dir := os.Getenv("ARBOR_UI_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	png, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	t.Logf("screenshot: %s", filepath.Join(dir, name))
}

// notPwned checks that no hostile string ran in the tab.
func notPwned(t *testing.T, b context.Context) {
	t.Helper()
	require.NotEqual(t, "pwned", text(t, b, `document.title`))
	require.Equal(t, "0", text(t, b, `String(document.querySelectorAll("main img").length)`))
}

// TestBrowserQueuedStuckFailed: the list tells a queued turn from a
// stuck run, flags failed only the conversation whose turn failed, and
// the tree draws the queued turn and the stuck run as such.
func TestBrowserQueuedStuckFailed(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	base := testdb.Name("q") + markup
	busy, toolFailed, turnFailed := base+"-busy", base+"-tool", base+"-turn"
	first, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: busy, Kind: "turn" + markup, Tenant: "acme" + markup})
	require.NoError(t, err)
	_, err = v.engine.Start(v.ctx, first.ID)
	require.NoError(t, err)
	queued, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: busy, Kind: "turn" + markup, Tenant: "acme" + markup})
	require.NoError(t, err)
	turn, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: toolFailed, Kind: "turn"})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, turn.ID)
	require.NoError(t, err)
	tool, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: toolFailed, OwnerID: turn.ID, Kind: "tool"})
	require.NoError(t, err)
	trun, err := v.engine.Start(v.ctx, tool.ID)
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, tool.ID, trun.Token, arbortype.TaskError{Code: "boom", Message: markup, NonRetryable: true})
	require.NoError(t, err)
	_, err = v.engine.Complete(v.ctx, turn.ID, run.Token, nil)
	require.NoError(t, err)
	other, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: turnFailed, Kind: "turn"})
	require.NoError(t, err)
	orun, err := v.engine.Start(v.ctx, other.ID)
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, other.ID, orun.Token, arbortype.TaskError{Code: "boom", Message: markup, NonRetryable: true})
	require.NoError(t, err)

	b := browser(t)
	rowOf := func(conv string) string {
		return fmt.Sprintf(`(() => { for (const a of document.querySelectorAll("#conversations a.id")) { if (a.textContent === %q) return a.closest("tr").textContent; } return "none"; })()`, conv)
	}
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/?q="+url.QueryEscape(base)), chromedp.WaitVisible(`#conversations`),
		chromedp.WaitVisible(`#live-status.on`)))
	require.Contains(t, text(t, b, rowOf(busy)), "1 queued")
	require.NotContains(t, text(t, b, rowOf(busy)), "stuck")
	flagged := func(conv string) string {
		return text(t, b, fmt.Sprintf(`(() => { for (const a of document.querySelectorAll("#conversations a.id")) { if (a.textContent === %q) return String(!!a.closest("tr").querySelector(".flag.failed")); } return "none"; })()`, conv))
	}
	require.Equal(t, "false", flagged(toolFailed), "a tool failed in a turn that answered")
	require.Equal(t, "true", flagged(turnFailed))
	notPwned(t, b)

	// The live turn's run stops heartbeating: the list shows it stuck
	// without a reload (its stream reads again within 15 refreshes).
	v.exec(t, `UPDATE {schema}.tasks SET lease_expires_at = now() - interval '5 minutes' WHERE id = $1`, first.ID)
	until(t, b, rowOf(busy)+`.includes("stuck: 1 running past its task lease")`)
	screenshot(t, b, "ui-list.png")

	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/conversation?id="+url.QueryEscape(busy)), chromedp.WaitVisible(`#live-status.on`),
		chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-state="queued"]`, queued.ID)),
		chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-state="stuck"]`, first.ID))))
	require.Contains(t, text(t, b, fmt.Sprintf(`document.querySelector("#task-%d").textContent`, queued.ID)), "queued")
	require.Contains(t, text(t, b, fmt.Sprintf(`document.querySelector("#task-%d").textContent`, first.ID)), "stuck: past its task lease")
	require.Contains(t, text(t, b, `document.getElementById("summary").textContent`), "1 turn queued")
	notPwned(t, b)
}

// TestBrowserDurations: a task's page shows its durations and the
// timeline of it and its children, live: a child that settles changes
// its bar without a reload.
func TestBrowserDurations(t *testing.T) {
	t.Parallel()
	v := newView(t, nil)
	conv := testdb.Conversation(t) + markup
	turn, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn" + markup})
	require.NoError(t, err)
	run, err := v.engine.Start(v.ctx, turn.ID)
	require.NoError(t, err)
	var kids []arbortype.Task
	for _, k := range []string{"search", "read" + markup} {
		kid, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: k})
		require.NoError(t, err)
		kids = append(kids, kid)
	}
	_, err = v.engine.WaitForChildren(v.ctx, turn.ID, run.Token, core.WaitParams{ChildIDs: []int64{kids[0].ID, kids[1].ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	krun, err := v.engine.Start(v.ctx, kids[0].ID)
	require.NoError(t, err)
	_, err = v.engine.Complete(v.ctx, kids[0].ID, krun.Token, nil)
	require.NoError(t, err)

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", v.base, turn.ID)), chromedp.WaitVisible(`#live-status.on`),
		chromedp.WaitVisible(`#durations`), chromedp.WaitVisible(`#timeline`)))
	require.Contains(t, text(t, b, `document.getElementById("durations").textContent`), "created → first start")
	for _, st := range []string{"pending", "running", "waiting"} {
		require.Equal(t, "true", text(t, b, fmt.Sprintf(`String(!!document.querySelector('#durations [data-in=%q]'))`, st)), st)
	}
	require.Equal(t, "3", text(t, b, `String(document.querySelectorAll("#timeline tr[data-timeline]").length)`))
	require.Equal(t, "true", text(t, b, fmt.Sprintf(`String(!!document.querySelector('[data-timeline="%d"] rect.seg-completed'))`, kids[0].ID)))
	// The bars have a width the page draws (SVG attributes: the page's
	// policy allows no inline style).
	require.NotEqual(t, "0", text(t, b, `String(Math.round(document.querySelector("#timeline svg").getBoundingClientRect().width))`))
	krun, err = v.engine.Start(v.ctx, kids[1].ID)
	require.NoError(t, err)
	_, err = v.engine.Fail(v.ctx, kids[1].ID, krun.Token, arbortype.TaskError{Code: "boom", Message: markup, NonRetryable: true})
	require.NoError(t, err)
	until(t, b, fmt.Sprintf(`!!document.querySelector('[data-timeline="%d"] rect.seg-failed')`, kids[1].ID))
	screenshot(t, b, "ui-task.png")
	notPwned(t, b)
}

// TestBrowserBudgetParkAndApprovalContext: the approvals page shows an
// approval's context (its name, phase and saved state, markup text
// shown as text) and a turn parked on a budget without approve or deny;
// its raise, clicked, raises the budget and the turn runs again.
func TestBrowserBudgetParkAndApprovalContext(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true})
	asker, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t) + markup, Kind: "mail_agent" + markup})
	require.NoError(t, err)
	arun, err := v.engine.Start(v.ctx, asker.ID)
	require.NoError(t, err)
	state, err := json.Marshal(map[string]string{"to": "ana@example.com", "body": markup})
	require.NoError(t, err)
	_, err = v.engine.AwaitEvent(v.ctx, asker.ID, arun.Token, core.AwaitParams{Name: "send?" + markup, Phase: "confirm" + markup, State: state})
	require.NoError(t, err)

	conv := testdb.Conversation(t) + markup
	parked, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "agent_turn"})
	require.NoError(t, err)
	_, err = v.engine.SetBudget(v.ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	prun, err := v.engine.Start(v.ctx, parked.ID)
	require.NoError(t, err)
	_, err = v.engine.C.ReserveBudget(v.ctx, core.ReserveParams{ConversationID: conv, TaskID: parked.ID, Token: prun.Token,
		Counter: "tokens", Amount: 150, Key: "call-1"})
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/approvals"), chromedp.WaitVisible(`#live-status.on`),
		chromedp.WaitVisible(fmt.Sprintf(`#await-%d`, asker.ID)), chromedp.WaitVisible(fmt.Sprintf(`#await-%d[data-park="budget"]`, parked.ID))))
	ctxRow := fmt.Sprintf(`document.querySelector("#await-%d")`, asker.ID)
	require.Equal(t, "send?"+markup, text(t, b, ctxRow+`.querySelector(".await-name").textContent`))
	require.Equal(t, "confirm"+markup, text(t, b, ctxRow+`.querySelector(".phase").textContent`))
	require.Contains(t, text(t, b, ctxRow+`.querySelector("pre.state").textContent`), "ana@example.com")
	require.Equal(t, "true", text(t, b, fmt.Sprintf(`String(!!document.querySelector('button[data-approve="%d"]'))`, asker.ID)))
	require.Equal(t, "false", text(t, b, fmt.Sprintf(`String(!!document.querySelector('button[data-approve="%d"], button[data-deny="%d"]'))`, parked.ID, parked.ID)),
		"no approve or deny on a budget park")
	require.Contains(t, text(t, b, fmt.Sprintf(`document.querySelector("#await-%d").textContent`, parked.ID)), "parked on a budget")
	notPwned(t, b)
	screenshot(t, b, "ui-approvals.png")

	submit(t, b, fmt.Sprintf(`button[data-raise="%d"]`, parked.ID))
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#approvals`), chromedp.WaitNotPresent(fmt.Sprintf(`#await-%d`, parked.ID))))
	budget, err := v.engine.Budget(v.ctx, conv, 0, "tokens")
	require.NoError(t, err)
	require.Equal(t, int64(200), budget.Max, "raised to the proposed maximum")
	require.Equal(t, arbortype.BudgetPark, budget.OnExhausted)
	got, err := v.engine.Get(v.ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "it runs again")
}

// TestBrowserStatsAndBulk: the stats page, reached from the navigation,
// counts the turns per tenant (markup names shown as text) and draws a
// bar group per minute; on the list, conversations ticked stay ticked
// while the live list is replaced, and the bulk abort aborts them.
func TestBrowserStatsAndBulk(t *testing.T) {
	t.Parallel()
	v := newView(t, &arborui.Options{Actions: true, Refresh: 50 * time.Millisecond})
	base := testdb.Name("s")
	var convs []string
	for i := range 3 {
		conv := fmt.Sprintf("%s-%d%s", base, i, markup)
		convs = append(convs, conv)
		turn, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Tenant: "t" + markup})
		require.NoError(t, err)
		if i == 0 {
			run, err := v.engine.Start(v.ctx, turn.ID)
			require.NoError(t, err)
			_, err = v.engine.Fail(v.ctx, turn.ID, run.Token, arbortype.TaskError{Code: "boom", Message: markup, NonRetryable: true})
			require.NoError(t, err)
		}
	}

	b := browser(t)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/"), chromedp.WaitVisible(`#nav-stats`)))
	submit(t, b, `#nav-stats`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#tenant-stats`), chromedp.WaitVisible(`#live-status.on`)))
	require.Equal(t, "60", text(t, b, `String(document.querySelectorAll("#chart g[data-minute]").length)`))
	row := text(t, b, `document.querySelector("#tenant-stats tbody tr").textContent`)
	require.Contains(t, row, "t"+markup)
	require.Regexp(t, `1\s*1\s*1\s*2`, row, "started, settled, failed, pending")
	notPwned(t, b)
	screenshot(t, b, "ui-stats.png")

	require.NoError(t, chromedp.Do(b, chromedp.Navigate(v.base+"/?q="+url.QueryEscape(base)), chromedp.WaitVisible(`#conversations`),
		chromedp.WaitVisible(`#live-status.on`)))
	box := func(conv string) string {
		return fmt.Sprintf(`(() => { for (const c of document.querySelectorAll("#conversations input[data-select]")) { if (c.value === %q) return c; } return null; })()`, conv)
	}
	for _, conv := range convs[1:] {
		_, err := chromedp.Run(b, chromedp.Evaluate[bool](box(conv)+`.click() || true`))
		require.NoError(t, err)
	}
	// A new conversation: the list is replaced; the ticks stay.
	before := text(t, b, `document.getElementById("list").dataset.updated || ""`)
	_, _, err := v.engine.Create(v.ctx, arbortype.CreateParams{ConversationID: base + "-new", Kind: "turn"})
	require.NoError(t, err)
	until(t, b, fmt.Sprintf(`(document.getElementById("list").dataset.updated || "") !== %q && !!%s`, before, box(base+"-new")))
	for _, conv := range convs[1:] {
		require.Equal(t, "true", text(t, b, `String(`+box(conv)+`.checked)`), conv)
	}
	require.Equal(t, "false", text(t, b, `String(`+box(base+"-new")+`.checked)`))
	require.NoError(t, chromedp.Do(b, chromedp.SendKeys(`#bulk input[name="reason"]`, "bulk"+markup)))
	submit(t, b, `#bulk-abort`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#conversations`)))
	loc, err := chromedp.Run(b, chromedp.Location())
	require.NoError(t, err)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, base, u.Query().Get("q"), "back on the list it acted from")
	for _, conv := range convs[1:] {
		all, err := v.engine.ConversationTasks(v.ctx, conv)
		require.NoError(t, err)
		for _, task := range all {
			require.True(t, task.Status.Settled(), "%s #%d %s", conv, task.ID, task.Status)
			require.Equal(t, "bulk"+markup, task.Error.Message)
		}
	}
	all, err := v.engine.ConversationTasks(v.ctx, base+"-new")
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, all[0].Status, "not ticked, not aborted")

	// The failed turn's conversation, ticked: its turn is rerun.
	_, err = chromedp.Run(b, chromedp.Evaluate[bool](box(convs[0])+`.click() || true`))
	require.NoError(t, err)
	submit(t, b, `#bulk-rerun`)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#conversations`)))
	all, err = v.engine.ConversationTasks(v.ctx, convs[0])
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, all[0].ID, all[1].RerunOf, "the failed turn, rerun")
	require.Equal(t, arbortype.StatusPending, all[1].Status)
	notPwned(t, b)
}
