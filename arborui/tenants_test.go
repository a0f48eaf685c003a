package arborui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
)

// TestTenantViews: a conversation's tenant shows in the list (a link that
// filters the list by it) and on its page; a task's priority, concurrency
// key and queue expiry in its tree and on its record; none of them where
// they are the defaults; all escaped.
func TestTenantViews(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Prefix: "/arbor"})
	tenant := `acme<script>alert(1)</script>` + "\x1b[31m"
	tconv, plainConv := b.conv+"-t", b.conv+"-p"
	task := b.create(t, arbortype.CreateParams{ConversationID: tconv, Kind: "turn", Tenant: tenant,
		Priority: 60, ConcurrencyKey: `<b>openai</b>`, QueueTTL: time.Hour})
	plain := b.create(t, arbortype.CreateParams{ConversationID: plainConv, Kind: "turn"})

	shown := `acme&lt;script&gt;alert(1)&lt;/script&gt;␛[31m`
	noMarkup := func(t *testing.T, where, body string) {
		t.Helper()
		require.NotContains(t, body, "<script>alert", where)
		require.NotContains(t, body, "<b>openai", where)
		require.NotContains(t, body, "\x1b", where)
	}

	code, page := b.get(t, "/?q="+url.QueryEscape(b.conv))
	require.Equal(t, http.StatusOK, code, page)
	noMarkup(t, "the list", page)
	require.Equal(t, 1, strings.Count(page, `class="tenant"`), "only the tenant's conversation is marked")
	require.Contains(t, page, `title="tenant">`+shown+`</a>`)
	require.Contains(t, page, `placeholder="tenant"`, "the filter's field")

	// The filter keeps the tenant's conversations; the link says how.
	code, page = b.get(t, "/?tenant="+url.QueryEscape(tenant))
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, ">"+tconv+"<")
	require.NotContains(t, page, ">"+plainConv+"<")
	require.Contains(t, page, `value="`+shown+`"`, "the field keeps the filter")
	for _, order := range []string{"", "id"} {
		_, page = b.get(t, "/?order="+order+"&tenant=nobody")
		require.NotContains(t, page, ">"+tconv+"<", order)
		require.Contains(t, page, `id="none"`, order)
	}

	code, page = b.get(t, "/conversation?id="+url.QueryEscape(tconv))
	require.Equal(t, http.StatusOK, code, page)
	noMarkup(t, "the conversation", page)
	require.Contains(t, page, `id="conv-tenant"`)
	require.Contains(t, page, ">"+shown+"</a>")
	require.Contains(t, page, `priority=60`)
	require.Contains(t, page, `key=&lt;b&gt;openai&lt;/b&gt;`)
	require.Contains(t, page, `class="expiry"`, "a pending task's queue expiry")
	_, page = b.get(t, "/conversation?id="+url.QueryEscape(plainConv))
	for _, s := range []string{`id="conv-tenant"`, "priority=", "key=", `class="expiry"`} {
		require.NotContains(t, page, s)
	}

	code, page = b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Equal(t, http.StatusOK, code, page)
	noMarkup(t, "the record", page)
	require.Contains(t, page, `<td id="tenant"><a href="/arbor/?tenant=`)
	require.Contains(t, page, `<td id="priority">60 `)
	require.Contains(t, page, `<td id="concurrency-key">&lt;b&gt;openai&lt;/b&gt; `)
	require.Contains(t, page, `<td id="queue-expiry">`+task.QueueExpiresAt.UTC().Format("2006-01-02 15:04:05"))
	_, page = b.get(t, fmt.Sprintf("/tasks/%d", plain.ID))
	for _, s := range []string{`id="tenant"`, `id="priority"`, `id="concurrency-key"`, `id="queue-expiry"`} {
		require.NotContains(t, page, s)
	}

	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	frag := b.stream(t, ctx, "/live?tenant="+url.QueryEscape(tenant)).next(t)
	noMarkup(t, "the list's stream", frag)
	require.Contains(t, frag, ">"+tconv+"<")
	require.NotContains(t, frag, ">"+plainConv+"<")
}

// TestLimitsPage: the limits page lists the concurrency limits with their
// running counts and the tenants' weights, escaped, and so does its
// stream; with none, it says so.
func TestLimitsPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	code, page := b.get(t, "/limits")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `id="nav-limits" class="here"`)
	require.Contains(t, page, "No concurrency limit")
	require.Contains(t, page, "No tenant has a weight")

	run := b.create(t, arbortype.CreateParams{Kind: "browse"})
	_, err := b.engine.Start(b.ctx, run.ID)
	require.NoError(t, err)
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:browse", 1))
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "key:<script>x</script>", 3))
	require.NoError(t, b.engine.SetTenantWeight(b.ctx, "acme\u202e<i>", 5))
	require.NoError(t, b.engine.SetTenantWeight(b.ctx, "", 2))

	check := func(t *testing.T, where, body string) {
		t.Helper()
		require.NotContains(t, body, "<script>x", where)
		require.NotContains(t, body, "<i>", where)
		require.NotContains(t, body, "\u202e", where)
		require.Regexp(t, `<tr data-key="kind:browse"><td class="id">kind:browse</td><td>1 <span class="flag awaiting">full</span></td><td>1</td>`, body, where)
		require.Contains(t, body, `<td class="id">key:&lt;script&gt;x&lt;/script&gt;</td><td>0</td><td>3</td>`, where)
		require.Contains(t, body, `(the default tenant)</span></td><td>2</td>`, where)
		require.Contains(t, body, `>acme[U+202E]&lt;i&gt;</a></td><td>5</td>`, where)
	}
	code, page = b.get(t, "/limits")
	require.Equal(t, http.StatusOK, code, page)
	check(t, "the page", page)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	check(t, "the stream", b.stream(t, ctx, "/limits/live").next(t))
}
