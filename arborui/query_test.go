package arborui_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/core"
)

// TestBadQueries: an address whose query the view cannot serve is refused
// with 400 and arbor's words, before anything is streamed: by a page and by
// its live stream alike (a stream that answered 200 and then one "failed"
// event would have the browser reconnect forever, each time reading the
// database), and never with the database's words about bytes it cannot
// store. Nothing is logged: a bad address is the client's, not a fault.
func TestBadQueries(t *testing.T) {
	t.Parallel()
	logs := &warnings{}
	b := setup(t, &arborui.Options{Logger: slog.New(logs)})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	conv := "id=" + url.QueryEscape(b.conv)
	big := strings.Repeat("r1", 50<<10) // 100 KB
	// notText are the values the database would refuse in its own words.
	notText := []string{"%00", "%FF", "a%00b", "%C3%28", "%ED%A0%80"}
	type form struct{ query, want string }
	var lists []form
	for _, v := range notText {
		for _, k := range []string{"q", "holder", "kind", "cursor", "order", "unknown"} {
			lists = append(lists, form{k + "=" + v, "is not text"})
		}
	}
	lists = append(lists,
		form{"cursor=abc", "cursor"}, form{"cursor=-1", "cursor"}, form{"cursor=r0", "cursor"}, form{"cursor=r-5", "cursor"},
		form{"cursor=ix", "cursor"}, form{"order=id&cursor=r5", "cursor"}, form{"cursor=" + big, "over the limit"},
		form{"q=" + big, "over the limit"}, form{"order=x", "order"}, form{"live=x", "live"}, form{"status=completed", "status"},
		form{"age=1y", "age"}, form{"q=%ZZ", "does not parse"}, form{"q=a;b", "does not parse"}, form{"%FF=1", "is not text"})
	routes := map[string][]form{"/": lists, "/live": lists}
	for _, path := range []string{"/approvals", "/approvals/live"} {
		routes[path] = []form{{"cursor=abc", "cursor"}, {"cursor=%FF", "is not text"}, {"cursor=%7B%22i%22%3A%22x%22%7D", "cursor"},
			{"cursor=" + big, "over the limit"}}
	}
	for _, path := range []string{"/conversation", "/conversation/live"} {
		routes[path] = []form{{"id=%00", "is not text"}, {"id=%FF", "is not text"}, {"id=" + strings.Repeat("c", 300), "over the limit"},
			{conv + "&status=x", "status"}, {conv + "&after=-1", "after"}, {conv + "&after=abc", "after"}, {conv + "&after=%00", "is not text"}}
	}
	for _, path := range []string{"/conversation/log", "/conversation/log/live"} {
		routes[path] = []form{{"id=%00", "is not text"}, {"id=%FF", "is not text"}, {conv + "&before=abc&after=abc", "position in the log"},
			{conv + "&before=-1&after=-1", "position in the log"}}
	}
	for _, path := range []string{fmt.Sprintf("/tasks/%d", task.ID), fmt.Sprintf("/tasks/%d/live", task.ID)} {
		routes[path] = []form{{"children_after=-1", "children_after"}, {"log_before=abc", "log_before"}, {"log_before=%FF", "is not text"}}
	}
	for _, path := range []string{"/nodes", "/nodes/live", fmt.Sprintf("/tasks/%d/doc/input", task.ID)} {
		routes[path] = []form{{"x=%00", "is not text"}, {"x=" + big, "over the limit"}}
	}
	for path, forms := range routes {
		for _, f := range forms {
			t.Run(fmt.Sprintf("%s?%.60s", path, f.query), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url(path)+"?"+f.query, nil)
				require.NoError(t, err)
				res, err := b.client.Do(req)
				require.NoError(t, err)
				defer res.Body.Close()
				require.Equal(t, http.StatusBadRequest, res.StatusCode, "answered before anything is streamed")
				require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
				body, err := io.ReadAll(res.Body)
				require.NoError(t, err)
				require.Contains(t, string(body), f.want)
				for _, db := range []string{"invalid byte sequence", "SQLSTATE", "22021", "encoding"} {
					require.NotContains(t, string(body), db, "the database's words")
				}
			})
		}
	}
	require.Empty(t, logs.got(), "a bad address is not logged as a failure")

	// The same addresses, well formed, are served and streamed.
	for _, path := range []string{"/live?q=x&holder=h&kind=k", "/approvals/live", "/nodes/live", "/conversation/live?" + conv,
		fmt.Sprintf("/tasks/%d/live?children_after=0", task.ID)} {
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		b.stream(t, ctx, path).next(t)
		cancel()
	}
}

// warnings is a slog handler that keeps the messages of warnings and
// errors.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.msgs = append(w.msgs, r.Message)
	}
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// TestAnswerWithAnotherTasksToken: the answer form of task A's page
// answers A's await only. Carrying the token of another task's await —
// of another conversation, of a sibling, or A's id with another token's
// random part — it is refused, and nothing is written to either task;
// A's own token answers A.
func TestAnswerWithAnotherTasksToken(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	await := func(conv string) (arbortype.Task, string) {
		task := b.create(t, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		run, err := b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		res, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
		require.NoError(t, err)
		return task, res.Task.AwaitToken
	}
	a, aToken := await(b.conv)
	sibling, siblingToken := await(b.conv)
	other, otherToken := await(b.conv + "-other")
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", a.ID))
	csrf := token(t, page)
	unanswered := func(t *testing.T) {
		t.Helper()
		for _, task := range []arbortype.Task{a, sibling, other} {
			got, err := b.engine.Get(b.ctx, task.ID)
			require.NoError(t, err)
			require.Equal(t, arbortype.StatusSleeping, got.Status, "task %d", task.ID)
			require.Nil(t, got.Delivered, "task %d", task.ID)
		}
		for _, conv := range []string{b.conv, b.conv + "-other"} {
			evs, err := b.engine.Events(b.ctx, conv, 0, 100)
			require.NoError(t, err)
			require.Empty(t, evs, "no event was emitted to %s", conv)
		}
	}
	_, random, _ := strings.Cut(strings.TrimPrefix(otherToken, "awt_"), "_")
	for name, c := range map[string]struct {
		token string
		code  int
		want  string
	}{
		"another conversation's":      {otherToken, http.StatusBadRequest, fmt.Sprintf("of task #%d, not of task #%d", other.ID, a.ID)},
		"a sibling's":                 {siblingToken, http.StatusBadRequest, fmt.Sprintf("of task #%d, not of task #%d", sibling.ID, a.ID)},
		"of another form, not A's":    {"legacy-" + random, http.StatusBadRequest, fmt.Sprintf("not the one of task #%d", a.ID)},
		"A's id, another's random":    {fmt.Sprintf("awt_%d_%s", a.ID, random), http.StatusConflict, "await"},
		"A's own, not text":           {aToken + "\xff", http.StatusBadRequest, "is not text"},
		"A's own, a payload not text": {aToken, http.StatusBadRequest, "is not text"},
	} {
		t.Run(name, func(t *testing.T) {
			payload := `{"note": "ok"}`
			if name == "A's own, a payload not text" {
				payload = "{\"note\": \"\xff\"}"
			}
			for _, decision := range []string{"", "approve"} {
				code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", a.ID),
					url.Values{"csrf": {csrf}, "token": {c.token}, "decision": {decision}, "payload": {payload}}, nil)
				require.Equal(t, c.code, code, body)
				require.Contains(t, body, c.want)
				unanswered(t)
			}
		})
	}

	code, body, to := b.post(t, fmt.Sprintf("/tasks/%d/emit", a.ID), url.Values{"csrf": {csrf}, "token": {aToken}, "decision": {"approve"}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Equal(t, fmt.Sprintf("/tasks/%d", a.ID), to)
	got, err := b.engine.Get(b.ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "A's own token answers A")
	require.JSONEq(t, `{"approved": true}`, string(got.Delivered.Payload))
	for _, task := range []arbortype.Task{sibling, other} {
		got, err := b.engine.Get(b.ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusSleeping, got.Status, "task %d is still waiting", task.ID)
	}
}

// TestBadQueryOfAPost: a POST's query is read like a page's, after the
// checks that refuse a POST with 403 (actions off, another origin, no
// token); nothing is written.
func TestBadQueryOfAPost(t *testing.T) {
	t.Parallel()
	off := setup(t, nil)
	code, body, _ := off.post(t, "/conversation/abort?id=%00", url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "actions are disabled")

	b := setup(t, &arborui.Options{Actions: true})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	csrf := token(t, page)
	code, _, _ = b.post(t, "/conversation/abort?id=%FF", url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, code, "no token")
	for _, path := range []string{"/conversation/abort?id=%FF", "/conversation/emit?id=a%00b", "/conversation/abort?id=" + strings.Repeat("x", 9<<10),
		fmt.Sprintf("/tasks/%d/abort?x=%%FF", task.ID)} {
		code, body, _ := b.post(t, path, url.Values{"csrf": {csrf}, "name": {"go"}, "id": {b.conv}}, nil)
		require.Equal(t, http.StatusBadRequest, code, "%.60s: %s", path, body)
		require.NotContains(t, body, "invalid byte sequence")
	}
	got, err := b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status, "nothing was aborted")
	evs, err := b.engine.Events(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	require.Empty(t, evs)
}
