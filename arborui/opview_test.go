package arborui_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// exec runs SQL on the bundle's schema ({schema} in it replaced): setup
// of what no operation writes on demand (a lease that ran out, a task
// created long ago).
func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, strings.ReplaceAll(sql, "{schema}", `"`+b.schema+`"`), args...)
	require.NoError(t, err)
}

// forge runs SQL on the bundle's schema with the guard's triggers off (a
// superuser's replica role): what the guard refuses, such as a task
// backdated, as a test's setup.
func (b *bundle) forge(t *testing.T, sql string, args ...any) {
	t.Helper()
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, strings.ReplaceAll(sql, "{schema}", `"`+b.schema+`"`), args...)
		return err
	})
	require.NoError(t, err)
}

// row is the listing's row of conversation conv in page.
func row(t *testing.T, page, conv string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr>\s*(?:<td class="select">[^\n]*</td>\s*)?<td><a class="id" href="[^"]*">` + regexp.QuoteMeta(conv) + `</a>.*?</tr>`).FindString(page)
	require.NotEmpty(t, m, "no row of %s", conv)
	return m
}

// TestFailedMeansATurnFailed: a conversation is flagged failed, and kept
// by the "has failed" filter, when a turn (a root task) failed, not when
// a tool failed inside a turn that answered.
func TestFailedMeansATurnFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	toolFailed, turnFailed := b.conv+"-tool", b.conv+"-turn"
	turn := b.create(t, arbortype.CreateParams{ConversationID: toolFailed, Kind: "turn"})
	run, err := b.engine.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	tool := b.create(t, arbortype.CreateParams{ConversationID: toolFailed, OwnerID: turn.ID, Kind: "tool"})
	trun, err := b.engine.Start(b.ctx, tool.ID)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, tool.ID, trun.Token, arbortype.TaskError{Code: "boom", Message: "the tool failed", NonRetryable: true})
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, turn.ID, run.Token, nil)
	require.NoError(t, err)
	other := b.create(t, arbortype.CreateParams{ConversationID: turnFailed, Kind: "turn"})
	orun, err := b.engine.Start(b.ctx, other.ID)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, other.ID, orun.Token, arbortype.TaskError{Code: "boom", Message: "the turn failed", NonRetryable: true})
	require.NoError(t, err)

	code, page := b.get(t, "/?q="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code, page)
	require.NotContains(t, row(t, page, toolFailed), `class="flag failed"`, "a tool failed in a turn that answered")
	require.Contains(t, row(t, page, turnFailed), `class="flag failed"`)
	_, page = b.get(t, "/?failed=1&q="+url.QueryEscape(b.conv))
	require.Contains(t, page, ">"+turnFailed+"<")
	require.NotContains(t, page, ">"+toolFailed+"<")
}

// TestQueuedIsNotStuck: a turn pending behind a live one is queued, in
// the list and in the tree; a task running past its task lease, and a
// pending one a minute old that no holder holds, are stuck.
func TestQueuedIsNotStuck(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	first := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, err := b.engine.Start(b.ctx, first.ID)
	require.NoError(t, err)
	second := b.create(t, arbortype.CreateParams{Kind: "turn"})
	third := b.create(t, arbortype.CreateParams{Kind: "turn"})

	code, page := b.get(t, "/?q="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code, page)
	r := row(t, page, b.conv)
	require.Contains(t, r, "2 queued")
	require.NotContains(t, r, "stuck")
	_, tree := b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
	for _, q := range []arbortype.Task{second, third} {
		require.Contains(t, tree, fmt.Sprintf(`id="task-%d" data-status="pending" data-state="queued"`, q.ID))
	}
	require.Contains(t, tree, fmt.Sprintf(`id="task-%d" data-status="running">`, first.ID), "the live turn is neither")
	require.Contains(t, tree, "2 turns queued")

	// The live turn's run stops heartbeating: its lease runs out.
	b.exec(t, `UPDATE {schema}.tasks SET lease_expires_at = now() - interval '5 minutes' WHERE id = $1`, first.ID)
	_, page = b.get(t, "/?q="+url.QueryEscape(b.conv))
	require.Contains(t, row(t, page, b.conv), "stuck: 1 running past its task lease")
	_, tree = b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
	require.Contains(t, tree, fmt.Sprintf(`id="task-%d" data-status="running" data-state="stuck"`, first.ID))
	require.Contains(t, tree, "stuck: past its task lease by 5 min")

	// A turn of another conversation, pending for two minutes, held by
	// no one: stuck, not queued.
	lone := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-lone", Kind: "turn"})
	b.forge(t, `UPDATE {schema}.tasks SET created_at = now() - interval '2 minutes' WHERE id = $1`, lone.ID)
	_, page = b.get(t, "/?q="+url.QueryEscape(b.conv))
	r = row(t, page, b.conv+"-lone")
	require.Contains(t, r, "stuck: pending over a minute with no holder")
	require.NotContains(t, r, "queued")
	_, tree = b.get(t, "/conversation?id="+url.QueryEscape(b.conv+"-lone"))
	require.Contains(t, tree, fmt.Sprintf(`id="task-%d" data-status="pending" data-state="stuck"`, lone.ID))
}

// TestDurationsAndTimeline: a task's page says how long it was queued
// (created → first start), how long in each status (from its log), and
// draws its timeline beside its children's; a task whose log entries were
// pruned still shows what its timestamps tell.
func TestDurationsAndTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	turn := b.create(t, arbortype.CreateParams{Kind: "turn"})
	run, err := b.engine.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	tool := b.create(t, arbortype.CreateParams{OwnerID: turn.ID, Kind: "tool"})
	_, err = b.engine.WaitForChildren(b.ctx, turn.ID, run.Token, core.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	trun, err := b.engine.Start(b.ctx, tool.ID)
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, tool.ID, trun.Token, nil)
	require.NoError(t, err)
	late := b.create(t, arbortype.CreateParams{OwnerID: turn.ID, Kind: "late_tool"})

	code, page := b.get(t, fmt.Sprintf("/tasks/%d", turn.ID))
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `id="durations"`)
	require.Contains(t, page, "(created → first start)")
	for _, st := range []string{"pending", "running", "waiting"} {
		require.Contains(t, page, fmt.Sprintf(`data-in="%s"`, st), "time in %s, from the log", st)
	}
	for _, id := range []int64{turn.ID, tool.ID, late.ID} {
		require.Contains(t, page, fmt.Sprintf(`data-timeline="%d"`, id))
	}
	require.Contains(t, page, `class="seg-completed"`, "the tool's bar")
	require.Contains(t, page, `class="seg-waiting"`, "the turn's bar, from its log")
	require.Regexp(t, `<rect x="\d+" y="0" width="\d+" height="10" class="seg-queued">`, page)

	// Backdated and its log pruned: what the timestamps tell.
	b.forge(t, `UPDATE {schema}.tasks SET created_at = now() - interval '2 minutes' WHERE id = $1`, late.ID)
	b.forge(t, `DELETE FROM {schema}.conversation_log WHERE task_id = $1`, late.ID)
	_, page = b.get(t, fmt.Sprintf("/tasks/%d", late.ID))
	require.Regexp(t, `id="queued-for">2 min \d+ s <span class="muted">\(never started: still queued\)`, page)
	require.Contains(t, page, "No status entry of this task in its log")
}

// parkOnBudget creates a turn in conv under a budget of 100 tokens that
// parks, and parks it: a reservation of 150.
func parkOnBudget(t *testing.T, b *bundle, conv string) arbortype.Task {
	t.Helper()
	turn := b.create(t, arbortype.CreateParams{ConversationID: conv, Kind: "agent_turn"})
	_, err := b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	run, err := b.engine.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: conv, TaskID: turn.ID, Token: run.Token,
		Counter: "tokens", Amount: 150, Key: "call-1"})
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)
	got, err := b.engine.Get(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.BudgetEvent, got.AwaitName, "parked on the budget")
	return got
}

// TestBudgetPark: a turn parked on a budget is shown as such — on the
// approvals page without approve or deny, in the tree, on its page —
// with the budget that parked it and a raise; the raise (a POST with the
// form's token) raises it, keeping its action, and the turn runs again.
func TestBudgetPark(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	parked := parkOnBudget(t, b, b.conv)

	code, page := b.get(t, "/approvals")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, fmt.Sprintf(`id="await-%d" data-park="budget"`, parked.ID))
	require.Contains(t, page, "parked on a budget")
	require.NotContains(t, page, fmt.Sprintf(`data-approve="%d"`, parked.ID), "no approve on a budget park")
	require.NotContains(t, page, fmt.Sprintf(`data-deny="%d"`, parked.ID))
	require.Contains(t, page, fmt.Sprintf(`data-raise="%d"`, parked.ID))
	require.Contains(t, page, "<code>tokens</code> spent 0 of 100")
	require.Contains(t, page, `value="200"`, "twice the maximum, proposed")
	_, tree := b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
	require.Contains(t, tree, `<span class="badge status-parked">parked on a budget</span>`)
	_, task := b.get(t, fmt.Sprintf("/tasks/%d", parked.ID))
	require.Contains(t, task, `id="budget-park"`)
	require.Contains(t, task, `id="raise-forms"`)
	require.NotContains(t, task, `id="answer-form"`)
	csrf := token(t, page)

	// An answer through its token is refused, as before, and writes nothing.
	code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", parked.ID), url.Values{"csrf": {csrf}, "token": {parked.AwaitToken},
		"decision": {"approve"}}, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	// A raise that is no raise, a bad one, one without the token.
	form := func(max string) url.Values {
		return url.Values{"csrf": {csrf}, "scope": {"0"}, "counter": {"tokens"}, "max": {max}, "back": {"/approvals"}}
	}
	code, body, _ = b.post(t, fmt.Sprintf("/tasks/%d/raise", parked.ID), form("100"), nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "is not a raise")
	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/raise", parked.ID), form("lots"), nil)
	require.Equal(t, http.StatusBadRequest, code)
	bad := form("300")
	bad.Set("counter", "cost_micros")
	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/raise", parked.ID), bad, nil)
	require.Equal(t, http.StatusNotFound, code, "no such budget")
	noToken := form("300")
	noToken.Del("csrf")
	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/raise", parked.ID), noToken, nil)
	require.Equal(t, http.StatusForbidden, code)
	got, err := b.engine.Get(b.ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusSleeping, got.Status, "nothing written")

	code, _, to := b.post(t, fmt.Sprintf("/tasks/%d/raise", parked.ID), form("300"), nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/approvals", to)
	budget, err := b.engine.Budget(b.ctx, b.conv, 0, "tokens")
	require.NoError(t, err)
	require.Equal(t, int64(300), budget.Max)
	require.Equal(t, arbortype.BudgetPark, budget.OnExhausted, "the action is kept")
	got, err = b.engine.Get(b.ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "woken: it runs again and reserves anew")
	_, page = b.get(t, "/approvals")
	require.NotContains(t, page, fmt.Sprintf(`id="await-%d"`, parked.ID))

	ro := setup(t, nil)
	rparked := parkOnBudget(t, ro, ro.conv)
	_, page = ro.get(t, "/approvals")
	require.Contains(t, page, fmt.Sprintf(`id="await-%d" data-park="budget"`, rparked.ID))
	require.NotContains(t, page, "data-raise", "read-only: no action")
}

// TestApprovalContext: an approval shows the await's name and what its
// handler saved with it (phase and state, escaped, cut when long).
func TestApprovalContext(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	task := b.create(t, arbortype.CreateParams{Kind: "mail_agent"})
	run, err := b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	_, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "send_mail?", Phase: "confirm",
		State: json.RawMessage(`{"to": "ana@example.com", "body": "<script>alert(1)</script>", "padding_at_the_end": "` + strings.Repeat("x", 2000) + `"}`)})
	require.NoError(t, err)
	code, page := b.get(t, "/approvals")
	require.Equal(t, http.StatusOK, code, page)
	r := page[strings.Index(page, fmt.Sprintf(`id="await-%d"`, task.ID)):]
	require.Contains(t, r, `<span class="await-name">send_mail?</span>`)
	require.Contains(t, r, `<span class="phase">confirm</span>`)
	require.Contains(t, r, `ana@example.com`)
	require.Contains(t, r, `&lt;script&gt;alert(1)&lt;/script&gt;`)
	require.NotContains(t, page, "<script>alert")
	require.Contains(t, r, "characters, cut")
}

// TestStats: the stats page counts the turns started, settled and failed
// in the last hour per tenant (a tool's failure is not a turn's), and
// each tenant's pending tasks and oldest pending; the chart has a bar
// group per minute; a tenant's link shows its own chart.
func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Refresh: 10 * time.Millisecond})
	code, page := b.get(t, "/stats")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `id="no-stats"`)

	ok := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-1", Kind: "turn", Tenant: "acme"})
	run, err := b.engine.Start(b.ctx, ok.ID)
	require.NoError(t, err)
	tool := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-1", OwnerID: ok.ID, Kind: "tool"})
	trun, err := b.engine.Start(b.ctx, tool.ID)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, tool.ID, trun.Token, arbortype.TaskError{Code: "boom", Message: "tool", NonRetryable: true})
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, ok.ID, run.Token, nil)
	require.NoError(t, err)
	bad := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-2", Kind: "turn", Tenant: "acme"})
	brun, err := b.engine.Start(b.ctx, bad.ID)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, bad.ID, brun.Token, arbortype.TaskError{Code: "boom", Message: "turn", NonRetryable: true})
	require.NoError(t, err)
	b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-3", Kind: "turn", Tenant: "<globex>"})
	b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-4", Kind: "turn", Tenant: "<globex>"})

	code, page = b.get(t, "/stats")
	require.Equal(t, http.StatusOK, code, page)
	cells := func(tenant string) []string {
		m := regexp.MustCompile(`(?s)<tr data-tenant="` + regexp.QuoteMeta(tenant) + `">.*?</tr>`).FindString(page)
		require.NotEmpty(t, m, "no row of %s", tenant)
		var out []string
		for _, c := range regexp.MustCompile(`<td>(.*?)</td>`).FindAllStringSubmatch(m, -1) {
			out = append(out, regexp.MustCompile(`<[^>]+>`).ReplaceAllString(c[1], ""))
		}
		return out
	}
	require.Equal(t, []string{"2", "2", "1", "0", "—"}, cells("acme"), "started, settled, failed, pending, oldest")
	globex := cells("&lt;globex&gt;")
	require.Equal(t, []string{"0", "0", "0", "2"}, globex[:4])
	require.NotEqual(t, "—", globex[4], "an oldest pending")
	require.Equal(t, 60, strings.Count(page, "<g data-minute="))
	require.Contains(t, page, `id="stats-total"`)
	require.Contains(t, page, `data-live="/stats/live"`)
	require.Contains(t, page, `href="/stats?tenant=%3Cglobex%3E"`)

	_, page = b.get(t, "/stats?tenant=acme")
	require.Contains(t, page, `tenant <span class="id">acme</span>`)
	require.Contains(t, page, `data-live="/stats/live?tenant=acme"`)

	// The stream: the figures at once, and again later with what changed.
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	s := b.stream(t, ctx, "/stats/live?tenant=acme")
	require.Contains(t, s.next(t), `id="tenant-stats"`)
	b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-5", Kind: "turn", Tenant: "acme"})
	acme := regexp.MustCompile(`(?s)<tr data-tenant="acme">.*?</tr>`)
	for !strings.Contains(acme.FindString(s.next(t)), "\n  <td>1</td><td>") {
	}
}

// TestBulkActions: the conversations ticked in the list are aborted, or
// their live turns cancelled (the queued one too), in one POST under the
// token and origin rules; one that cannot be acted on is named, the
// others done.
func TestBulkActions(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	a, c, d := b.conv+"-a&id=x", b.conv+"-c", b.conv+"-d"
	aTurn := b.create(t, arbortype.CreateParams{ConversationID: a, Kind: "turn"})
	_, err := b.engine.Start(b.ctx, aTurn.ID)
	require.NoError(t, err)
	aTool := b.create(t, arbortype.CreateParams{ConversationID: a, OwnerID: aTurn.ID, Kind: "tool"})
	cTurn := b.create(t, arbortype.CreateParams{ConversationID: c, Kind: "turn"})
	dTurn := b.create(t, arbortype.CreateParams{ConversationID: d, Kind: "turn"})
	_, err = b.engine.Start(b.ctx, dTurn.ID)
	require.NoError(t, err)
	dQueued := b.create(t, arbortype.CreateParams{ConversationID: d, Kind: "turn"})

	code, page := b.get(t, "/?q="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `<form class="bulk" id="bulk" method="post" action="/conversations/bulk">`)
	require.Contains(t, page, `<input type="checkbox" name="id" value="`+attr(a)+`" form="bulk"`)
	csrf := token(t, page)
	back := "/?q=" + url.QueryEscape(b.conv)

	// Refused: no token, no selection, an unknown action.
	code, _, _ = b.post(t, "/conversations/bulk", url.Values{"id": {a}, "action": {"abort"}}, nil)
	require.Equal(t, http.StatusForbidden, code)
	code, body, _ := b.post(t, "/conversations/bulk", url.Values{"csrf": {csrf}, "action": {"abort"}}, nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "no conversation selected")
	code, _, _ = b.post(t, "/conversations/bulk", url.Values{"csrf": {csrf}, "id": {a}, "action": {"delete"}}, nil)
	require.Equal(t, http.StatusBadRequest, code)

	code, _, to := b.post(t, "/conversations/bulk", url.Values{"csrf": {csrf}, "id": {a, c}, "action": {"abort"},
		"reason": {"bulk stop"}, "back": {back}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, back, to)
	for _, id := range []int64{aTurn.ID, aTool.ID, cTurn.ID} {
		got, err := b.engine.Get(b.ctx, id)
		require.NoError(t, err)
		require.True(t, got.Status.Settled(), "#%d %s", id, got.Status)
	}
	got, err := b.engine.Get(b.ctx, aTurn.ID)
	require.NoError(t, err)
	require.Equal(t, "bulk stop", got.Error.Message)

	code, body, _ = b.post(t, "/conversations/bulk", url.Values{"csrf": {csrf}, "id": {d, b.conv + "-ghost"}, "action": {"cancel"}}, nil)
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "cancel: 1 of 2 conversations done; not done: "+b.conv+"-ghost")
	for _, id := range []int64{dTurn.ID, dQueued.ID} {
		got, err := b.engine.Get(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusCancelled, got.Status, "#%d", id)
	}

	// Rerun: each one's newest turn, from its checkpoint — a's aborted
	// turn and d's cancelled queued one; c's turn never ran (orphaned),
	// so it is named, not rerun.
	require.Contains(t, page, `id="bulk-rerun"`)
	code, body, _ = b.post(t, "/conversations/bulk", url.Values{"csrf": {csrf}, "id": {a, c, d}, "action": {"rerun"}}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, fmt.Sprintf("rerun: 2 of 3 conversations done; not done: %s: turn #%d", c, cTurn.ID))
	for conv, src := range map[string]int64{a: aTurn.ID, d: dQueued.ID} {
		all, err := b.engine.ConversationTasks(b.ctx, conv)
		require.NoError(t, err)
		last := all[len(all)-1]
		require.Equal(t, src, last.RerunOf, conv)
		require.Equal(t, arbortype.StatusPending, last.Status)
	}

	ro := setup(t, nil)
	ro.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page = ro.get(t, "/")
	require.NotContains(t, page, `form="bulk"`)
	code, _, _ = ro.post(t, "/conversations/bulk", url.Values{"id": {ro.conv}, "action": {"abort"}}, nil)
	require.Equal(t, http.StatusForbidden, code)
}

// TestTenantBudgetPark: a turn parked on its tenant's budget (a window of
// a minute) is shown with that budget, and its raise raises the
// tenant's budget through SetTenantBudget, keeping its action and window.
func TestTenantBudgetPark(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	tenant := "acme<&>"
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark, Window: time.Minute})
	require.NoError(t, err)
	turn := b.create(t, arbortype.CreateParams{Kind: "agent_turn", Tenant: tenant})
	run, err := b.engine.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: turn.ID, Token: run.Token,
		Counter: "tokens", Amount: 150, Key: "call-1"})
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)

	code, page := b.get(t, "/approvals")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `tenant <span class="id">acme&lt;&amp;&gt;</span> per minute: <code>tokens</code> spent 0 of 100`)
	require.Contains(t, page, `<input type="hidden" name="tenant" value="1"><input type="hidden" name="window" value="60">`)
	csrf := token(t, page)
	form := url.Values{"csrf": {csrf}, "scope": {"0"}, "counter": {"tokens"}, "tenant": {"1"}, "window": {"3600"}, "max": {"300"}}
	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/raise", turn.ID), form, nil)
	require.Equal(t, http.StatusNotFound, code, "no budget of that window")
	form.Set("window", "60")
	code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/raise", turn.ID), form, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	bs, err := b.engine.TenantBudgets(b.ctx, tenant)
	require.NoError(t, err)
	require.Len(t, bs, 1)
	require.Equal(t, int64(300), bs[0].Max)
	require.Equal(t, arbortype.BudgetPark, bs[0].OnExhausted)
	require.Equal(t, time.Minute, bs[0].Window)
	got, err := b.engine.Get(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "woken")
}

// TestRerunAction: a failed tool's page offers its rerun (a live task's
// does not); the rerun, under the token and origin rules, is a new task,
// whose page the browser is sent to and which names its source; a second
// rerun of the same task is refused with the engine's reason.
func TestRerunAction(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	turn := b.create(t, arbortype.CreateParams{Kind: "turn"})
	run, err := b.engine.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	tool := b.create(t, arbortype.CreateParams{OwnerID: turn.ID, Kind: "tool"})
	other := b.create(t, arbortype.CreateParams{OwnerID: turn.ID, Kind: "tool"})
	_, err = b.engine.WaitForChildren(b.ctx, turn.ID, run.Token, core.WaitParams{ChildIDs: []int64{tool.ID, other.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	tr, err := b.engine.Start(b.ctx, tool.ID)
	require.NoError(t, err)
	_, err = b.engine.Checkpoint(b.ctx, tool.ID, tr.Token, "page-2", nil)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, tool.ID, tr.Token, arbortype.TaskError{Code: "upstream"})
	require.NoError(t, err)

	code, page := b.get(t, fmt.Sprintf("/tasks/%d", turn.ID))
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, page, `id="rerun"`, "a live task is not rerun")
	code, page = b.get(t, fmt.Sprintf("/tasks/%d", tool.ID))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `<button id="rerun">rerun from its checkpoint (phase page-2)</button>`)
	csrf := token(t, page)

	code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/rerun", tool.ID), url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, code, "no token")
	code, body, to := b.post(t, fmt.Sprintf("/tasks/%d/rerun", tool.ID), url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	all, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)
	rerun := all[len(all)-1]
	require.Equal(t, tool.ID, rerun.RerunOf)
	require.Equal(t, fmt.Sprintf("/tasks/%d", rerun.ID), to)
	code, page = b.get(t, to)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, fmt.Sprintf(`<td id="rerun-of"><a href="/tasks/%d">#%d</a>, from its checkpoint</td>`, tool.ID, tool.ID))
	got, err := b.engine.Get(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, []int64{rerun.ID, other.ID}, got.WaitIDs, "the turn waits on the rerun")

	code, body, _ = b.post(t, fmt.Sprintf("/tasks/%d/rerun", tool.ID), url.Values{"csrf": {csrf}}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, fmt.Sprintf("task %d", rerun.ID))
}
