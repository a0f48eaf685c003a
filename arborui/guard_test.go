package arborui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/tasks"
)

// hostileIDs are conversation ids that an address must encode: each
// holds a character with a meaning in a URL, an attribute or a stream.
var hostileIDs = []string{"victim#x", "victim&id=other", "victim+x", "victim%23", "victim?x=1", "victim x",
	`victim"'<>`, "victim/../..", "victim\x1b[31m"}

// TestHostileConversationIDs: every address that names a conversation
// carries its id percent-encoded, so the page of "victim#x" streams
// "victim#x" (not "victim"), and its actions act on it.
func TestHostileConversationIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	victim := b.create(t, arbortype.CreateParams{ConversationID: "victim", Kind: "victim_turn"})
	for _, id := range hostileIDs {
		t.Run(id, func(t *testing.T) {
			task := b.create(t, arbortype.CreateParams{ConversationID: id, Kind: "own_turn"})
			code, page := b.get(t, "/conversation?id="+url.QueryEscape(id))
			require.Equal(t, http.StatusOK, code, page)
			require.Contains(t, page, `data-live="/conversation/live?id=`+attr(url.QueryEscape(id))+`"`)
			require.Contains(t, page, `action="/conversation/abort?id=`+attr(url.QueryEscape(id))+`"`)
			require.Contains(t, page, `name="back" value="/conversation?id=`+attr(url.QueryEscape(id))+`"`)
			_, rec := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
			require.Contains(t, rec, `href="/conversation?id=`+attr(url.QueryEscape(id))+`"`)

			ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
			defer cancel()
			frag := b.stream(t, ctx, "/conversation/live?id="+url.QueryEscape(id)).next(t)
			require.Contains(t, frag, fmt.Sprintf(`id="task-%d"`, task.ID))
			require.NotContains(t, frag, fmt.Sprintf(`id="task-%d"`, victim.ID))
			cancel()

			// The abort of the page acts on its own conversation.
			csrf := token(t, page)
			code, _, to := b.post(t, "/conversation/abort?id="+url.QueryEscape(id), url.Values{"csrf": {csrf}}, nil)
			require.Equal(t, http.StatusSeeOther, code)
			require.Equal(t, "/conversation?id="+url.QueryEscape(id), to)
			got, err := b.engine.Get(b.ctx, task.ID)
			require.NoError(t, err)
			require.True(t, got.Status.Settled(), got.Status)
		})
	}
	got, err := b.engine.Get(b.ctx, victim.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "no page acted on victim")
}

// attr is s as html/template writes it in an attribute.
func attr(s string) string {
	return strings.NewReplacer("&", "&amp;", "'", "&#39;", `"`, "&#34;", "+", "&#43;").Replace(s)
}

// TestHostHeader: a request naming a host other than an IP literal,
// localhost or one of Options.AllowedHosts is refused before anything is
// read or written — a page of evil.example rebound to the handler's
// address reads no token and aborts nothing.
func TestHostHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true, AllowedHosts: []string{"arbor.internal", "ops.example:8443"}})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	csrf := token(t, page)
	port := b.srv.URL[strings.LastIndex(b.srv.URL, ":")+1:]
	do := func(method, host, path string, form url.Values) (int, string) {
		req, err := http.NewRequest(method, b.url(path), strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Host = host
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", "http://"+host)
		}
		res, err := b.client.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, "localhost.evil.example",
		"arbor.internal.evil.example", "ops.example:" + port, "ops.example"} {
		code, body := do(http.MethodGet, host, fmt.Sprintf("/tasks/%d", task.ID), nil)
		require.Equal(t, http.StatusForbidden, code, host)
		require.Contains(t, body, "does not serve")
		require.NotContains(t, body, csrf)
		code, _ = do(http.MethodPost, host, fmt.Sprintf("/tasks/%d/abort", task.ID), url.Values{"csrf": {csrf}})
		require.Equal(t, http.StatusForbidden, code, host)
	}
	got, err := b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "nothing was aborted")
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "app.localhost:" + port, "[::1]:" + port,
		"10.1.2.3", "arbor.internal:" + port, "ARBOR.internal", "ops.example:8443",
		// A fully qualified name's trailing dot, and the case, are the
		// same host with or without a port.
		"arbor.internal.", "arbor.internal.:" + port, "ops.example.:8443", "OPS.Example.:8443", "localhost.:" + port} {
		code, _ := do(http.MethodGet, host, "/", nil)
		require.Equal(t, http.StatusOK, code, host)
	}
	code, _ := do(http.MethodPost, "arbor.internal:"+port, fmt.Sprintf("/tasks/%d/abort", task.ID), url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, code, "an allowed name acts")
}

// TestBackIsSamePath: an action's "back" address is followed only when it
// is a path of the handler's own; anything a browser could read as
// another site (or that leaves the prefix) sends it to the task instead.
func TestBackIsSamePath(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true, Prefix: "/arbor"})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	csrf := token(t, page)
	fallback := fmt.Sprintf("/arbor/tasks/%d", task.ID)
	for back, want := range map[string]string{
		"/\t/evil.example/":                fallback,
		"/arbor/\t/evil.example/":          fallback,
		"//evil.example/":                  fallback,
		"/\\evil.example/":                 fallback,
		"/arbor\\..\\..\\evil":             fallback,
		"https://evil.example/arbor/":      fallback,
		"http:/arbor/":                     fallback,
		"javascript:alert(1)//arbor/":      fallback,
		" /arbor/":                         fallback,
		"/arbor/x\r\nSet-Cookie: a=b":      fallback,
		"/arbor/../evil":                   fallback,
		"/arbor/./../../evil":              fallback,
		"/other/":                          fallback,
		"/arbor":                           fallback,
		"":                                 fallback,
		"/arbor/conversation?id=victim%23": "/arbor/conversation?id=victim%23",
		"/arbor/":                          "/arbor/",
		"/arbor//x":                        "/arbor/x",
	} {
		code, _, to := b.post(t, fmt.Sprintf("/tasks/%d/emit", task.ID), url.Values{"csrf": {csrf}, "name": {"nudge"}, "back": {back}}, nil)
		require.Equal(t, http.StatusSeeOther, code, "%q", back)
		require.Equal(t, want, to, "%q", back)
	}
}

// TestControlCharacters: the controls a terminal or the text direction
// acts on reach no page and no fragment raw, in any field; they show as
// symbols.
func TestControlCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	evil := "a\x1b[2J\x1b]0;pwned\x07\u009b31m\u202etxt.exe\u2066b\x7f\r"
	conv := "conv\x1b[31m" + b.conv
	root := b.create(t, arbortype.CreateParams{ConversationID: conv, Kind: "turn" + evil, Input: mustJSON(t, map[string]string{"q": evil})})
	run, err := b.engine.Start(b.ctx, root.ID)
	require.NoError(t, err)
	_, err = b.engine.Checkpoint(b.ctx, root.ID, run.Token, "phase"+evil, mustJSON(t, map[string]string{"s": evil}))
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: conv, TaskID: root.ID, Name: "ev" + evil, Payload: mustJSON(t, evil)})
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, root.ID, run.Token, arbortype.TaskError{Code: "code" + evil, Message: evil, NonRetryable: true})
	require.NoError(t, err)

	check := func(t *testing.T, where, body string) {
		t.Helper()
		for _, c := range []string{"\x1b", "\x07", "\x7f", "\r", "\u009b", "\u202e", "\u2066"} {
			require.NotContains(t, body, c, "%s holds %q", where, c)
		}
		require.Contains(t, body, "␛[2J", where)
		require.Contains(t, body, "[U+202E]", where)
	}
	for _, path := range []string{fmt.Sprintf("/tasks/%d", root.ID), "/conversation?id=" + url.QueryEscape(conv)} {
		code, body := b.get(t, path)
		require.Equal(t, http.StatusOK, code, path)
		check(t, path, body)
	}
	for path, want := range map[string]int{"/": 200, "/conversation?id=" + url.QueryEscape("nobody"+evil): 404} {
		code, body := b.get(t, path)
		require.Equal(t, want, code, path)
		require.NotContains(t, body, "\x1b", path)
		if want == 200 {
			require.Contains(t, body, "␛[31m", path)
		}
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	check(t, "the record's stream", b.stream(t, ctx, fmt.Sprintf("/tasks/%d/live", root.ID)).next(t))
	check(t, "the tree's stream", b.stream(t, ctx, "/conversation/live?id="+url.QueryEscape(conv)).next(t))
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	out, err := json.Marshal(v)
	require.NoError(t, err)
	return out
}

// TestRoutesRefused: the folder of assets is not listed, a method a
// route does not take is 405.
func TestRoutesRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for path, want := range map[string]int{"/assets/": 404, "/assets": 404, "/assets/app.js": 200, "/assets/style.css": 200,
		"/assets/nothing.js": 404, "/assets/%2e%2e/handler.go": 404} {
		code, body := b.get(t, path)
		require.Equal(t, want, code, path)
		require.NotContains(t, body, `<a href="app.js">`, path)
	}
	res, err := b.client.Post(b.url("/"), "application/x-www-form-urlencoded", nil)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
}

// TestAllowedHostsValidated: an Options.AllowedHosts entry that is not a
// host name with an optional port, an IP address, nor "*" is an error of
// NewHandler naming the field, not a silently dead entry; an entry
// written with a trailing dot or in capitals matches the host as the
// browser names it.
func TestAllowedHostsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	long := strings.Repeat("a", 60) + "."
	for _, host := range []string{"", " ", "host:99999", "host:-1", "host:0", "host:", "host:+80", "host:80:80", "host:8o",
		"[::1", "[::1]x", "[nothost]:80", "[::1]:99999", ":8080", ".", ".example.com", "a..b", "a.b..", "-a.example", "a-.example",
		strings.Repeat(long, 5) + "com", strings.Repeat("a", 64) + ".example", "a b", "a/b", "a\\b", "a?b", "a#b", "user@host",
		"*.example.com", "ex*mple", "bücher.example", "host\x00", "host\n", "a.b\x7f"} {
		_, err := arborui.NewHandler(b.engine.Engine, &arborui.Options{AllowedHosts: []string{"ok.example", host}})
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%q", host)
		require.ErrorContains(t, err, "Options.AllowedHosts", "%q", host)
	}
	for _, host := range []string{"*", "ops.example.com", "ops.example.com:8443", "OPS.Example.COM.", "ops.example.com.:8443",
		"my_service", "xn--bcher-kva.example", "10.0.0.1", "10.0.0.1:80", "::", "::1", "[::1]", "[::1]:8080", "localhost:1",
		strings.Repeat("a", 63) + ".example", strings.Repeat(long, 4) + "com"} {
		_, err := arborui.NewHandler(b.engine.Engine, &arborui.Options{AllowedHosts: []string{host}})
		require.NoError(t, err, "%q", host)
	}

	// Written with a trailing dot and capitals, and a port with a leading
	// zero: the same entries as their plain forms.
	h, err := arborui.NewHandler(b.engine.Engine, &arborui.Options{AllowedHosts: []string{"Dotted.Example.:9000", "plain.example."}})
	require.NoError(t, err)
	for host, want := range map[string]int{"dotted.example:9000": 200, "dotted.example.:9000": 200, "DOTTED.example:09000": 200,
		"dotted.example:9001": 403, "dotted.example": 403, "plain.example": 200, "plain.example.:1": 200, "plain.example..": 403,
		"evil.example": 403} {
		req := httptest.NewRequest(http.MethodGet, "/nodes", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, want, rec.Code, host)
	}
}
