package arborui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestMain fails the package if goroutines (a live stream's follower)
// outlive its tests.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	engine *enginetest.Engine
	conv   string
	srv    *httptest.Server
	prefix string
	client *http.Client
}

// setup serves a handler with opts on a schema of the test's own (live
// streams LISTEN) and gives it a conversation id.
func setup(t *testing.T, opts *arborui.Options) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	ctx := context.Background()
	engine := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	if opts == nil {
		opts = &arborui.Options{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	h, err := arborui.NewHandler(engine.Engine, opts)
	require.NoError(t, err)
	b := &bundle{ctx: ctx, pool: pool, schema: schema, engine: engine, conv: testdb.Conversation(t), srv: httptest.NewServer(h),
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.prefix = opts.Prefix
	t.Cleanup(b.srv.Close)
	return b
}

// testWriter writes the handler's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (b *bundle) url(path string) string { return b.srv.URL + b.prefix + path }

func (b *bundle) get(t *testing.T, path string) (int, string) {
	t.Helper()
	res, err := b.client.Get(b.url(path))
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

// post posts form as a page of the handler's own would: same origin.
func (b *bundle) post(t *testing.T, path string, form url.Values, header map[string]string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url(path), strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.srv.URL)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := b.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body), res.Header.Get("Location")
}

func (b *bundle) create(t *testing.T, p arbortype.CreateParams) arbortype.Task {
	t.Helper()
	if p.ConversationID == "" {
		p.ConversationID = b.conv
	}
	task, _, err := b.engine.Create(b.ctx, p)
	require.NoError(t, err)
	return task
}

// fixedTrace is a trace injector that gives every task it.
type fixedTrace map[string]string

func (f fixedTrace) InjectTrace(context.Context) map[string]string { return f }

// createTraced creates a root task whose trace context is traceparent,
// through an engine whose injector stores it.
func (b *bundle) createTraced(t *testing.T, traceparent string) arbortype.Task {
	t.Helper()
	e, err := tasks.New(b.ctx, b.pool, &tasks.Config{Schema: b.schema, TraceInjector: fixedTrace{"traceparent": traceparent}})
	require.NoError(t, err)
	task, _, err := e.Create(b.ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "traced"})
	require.NoError(t, err)
	return task
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token reads the handler's form token from a page of it.
func token(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	require.NotNil(t, m, "no form token in the page")
	return m[1]
}

func TestPages(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Prefix: "/ops/arbor"})
	root := b.create(t, arbortype.CreateParams{Kind: "turn", Input: json.RawMessage(`{"q": "weather"}`)})
	child := b.create(t, arbortype.CreateParams{Kind: "search", OwnerID: root.ID})
	done := b.create(t, arbortype.CreateParams{ConversationID: b.conv + "-done", Kind: "turn"})
	started, err := b.engine.Start(b.ctx, done.ID)
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, done.ID, started.Token, json.RawMessage(`{"answer": 42}`))
	require.NoError(t, err)

	t.Run("index lists the conversations, newest first, filtered", func(t *testing.T) {
		t.Parallel()
		code, body := b.get(t, "/")
		require.Equal(t, http.StatusOK, code)
		i, j := strings.Index(body, "?id="+b.conv+"-done"), strings.Index(body, "?id="+b.conv+`"`)
		require.True(t, i >= 0 && j > i, "both listed, the newest first")
		require.Contains(t, body, `href="/ops/arbor/assets/style.css"`, "links carry the prefix")
		require.Contains(t, body, `data-live="/ops/arbor/live"`)
		_, live := b.get(t, "/?live=live")
		require.Contains(t, live, "?id="+b.conv+`"`)
		require.NotContains(t, live, b.conv+"-done", "a settled conversation is not live")
		_, exact := b.get(t, "/?q="+url.QueryEscape(b.conv))
		require.Contains(t, exact, `id="exact"`)
	})
	t.Run("conversation shows the tree", func(t *testing.T) {
		t.Parallel()
		code, body := b.get(t, "/conversation?id="+url.QueryEscape(b.conv))
		require.Equal(t, http.StatusOK, code)
		i, j := strings.Index(body, fmt.Sprintf(`id="task-%d"`, root.ID)), strings.Index(body, fmt.Sprintf(`id="task-%d"`, child.ID))
		require.True(t, i >= 0 && j > i, "the child is drawn under its owner")
		require.Contains(t, body, fmt.Sprintf(`data-live="/ops/arbor/conversation/live?id=%s"`, b.conv))
		require.NotContains(t, body, "<form method=\"post\"", "read-only by default")
	})
	t.Run("task shows the record", func(t *testing.T) {
		t.Parallel()
		code, body := b.get(t, fmt.Sprintf("/tasks/%d", done.ID))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, `id="status">completed<`)
		require.Contains(t, body, "&#34;answer&#34;: 42")
		require.Contains(t, body, `id="budget"`, "the budget's place")
		require.Contains(t, body, `<span class="badge status-running">running</span>`, "the log")
	})
	t.Run("assets are served", func(t *testing.T) {
		t.Parallel()
		code, body := b.get(t, "/assets/app.js")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "EventSource")
	})
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/tasks/abc", http.StatusBadRequest, "task id &#34;abc&#34; is not a positive integer"},
		{"/tasks/-3", http.StatusBadRequest, "is not a positive integer"},
		{"/tasks/999999", http.StatusNotFound, "not found"},
		{"/conversation", http.StatusBadRequest, "needs ?id=CONVERSATION"},
		{"/conversation?id=nobody-" + b.conv, http.StatusNotFound, "not found"},
		{"/conversation/live?id=nobody-" + b.conv, http.StatusNotFound, "not found"},
		{"/tasks/999999/live", http.StatusNotFound, "not found"},
		{"/nothing", http.StatusNotFound, ""},
	} {
		t.Run("refused "+c.path, func(t *testing.T) {
			t.Parallel()
			code, body := b.get(t, c.path)
			require.Equal(t, c.code, code, body)
			require.Contains(t, body, c.want)
		})
	}
	t.Run("outside the prefix", func(t *testing.T) {
		t.Parallel()
		res, err := b.client.Get(b.srv.URL + "/ops/arborx/")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusNotFound, res.StatusCode)
	})
}

func TestOptionsValidated(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	engine, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	_, err = arborui.NewHandler(nil, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	for _, o := range []arborui.Options{{Prefix: "ops"}, {Prefix: "/ops/"}, {Prefix: "/o\"ps"}, {RecentLimit: -1}} {
		_, err := arborui.NewHandler(engine, &o)
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%+v", o)
		require.Contains(t, err.Error(), "Options.")
	}
}

// A task's input and result are user and model data: shown as text,
// never as markup, in the page and in the live fragment alike.
func TestEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	evil := `</pre><script>alert("x")</script><img src=x onerror='alert(1)'>`
	input, err := json.Marshal(map[string]string{"text": evil})
	require.NoError(t, err)
	task := b.create(t, arbortype.CreateParams{Kind: `<b>"kind"</b>`, Input: input})
	started, err := b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, task.ID, started.Token, arbortype.TaskError{Message: evil})
	require.NoError(t, err)

	check := func(t *testing.T, body string) {
		require.NotContains(t, body, "<script>alert")
		require.NotContains(t, body, "<img src=x")
		require.NotContains(t, body, `<b>"kind"</b>`)
		require.Contains(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
		require.Contains(t, body, "&lt;b&gt;&#34;kind&#34;&lt;/b&gt;")
	}
	for _, path := range []string{fmt.Sprintf("/tasks/%d", task.ID), "/conversation?id=" + url.QueryEscape(b.conv)} {
		code, body := b.get(t, path)
		require.Equal(t, http.StatusOK, code)
		check(t, body)
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s := b.stream(t, ctx, fmt.Sprintf("/tasks/%d/live", task.ID))
	check(t, s.next(t))
}

// stream is a live stream being read.
type stream struct {
	r    *bufio.Reader
	body io.Closer
}

func (b *bundle) stream(t *testing.T, ctx context.Context, path string) *stream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url(path), nil)
	require.NoError(t, err)
	res, err := b.client.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { res.Body.Close() })
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	return &stream{r: bufio.NewReader(res.Body), body: res.Body}
}

// next returns the data of the next fragment event.
func (s *stream) next(t *testing.T) string {
	t.Helper()
	name, data := s.nextEvent(t)
	require.Equal(t, "fragment", name, data)
	return data
}

// nextEvent returns the name and data of the next event.
func (s *stream) nextEvent(t *testing.T) (string, string) {
	t.Helper()
	var name string
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && name != "":
			return name, strings.Join(data, "\n")
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
}

// The tree's stream pushes a new fragment after each change to the
// conversation, from another connection than the stream's.
func TestLiveTree(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	root := b.create(t, arbortype.CreateParams{Kind: "turn"})
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s := b.stream(t, ctx, "/conversation/live?id="+url.QueryEscape(b.conv))
	first := s.next(t)
	require.Contains(t, first, fmt.Sprintf(`id="task-%d" data-status="pending"`, root.ID))

	child := b.create(t, arbortype.CreateParams{Kind: "tool", OwnerID: root.ID})
	for frag := s.next(t); !strings.Contains(frag, fmt.Sprintf(`id="task-%d"`, child.ID)); frag = s.next(t) {
	}
	started, err := b.engine.Start(b.ctx, child.ID)
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, child.ID, started.Token, json.RawMessage(`{"ok": true}`))
	require.NoError(t, err)
	for frag := s.next(t); !strings.Contains(frag, fmt.Sprintf(`id="task-%d" data-status="completed"`, child.ID)); frag = s.next(t) {
	}
	cancel()
}

// Read-only: no action is offered, and a POST is refused whatever it
// carries, with nothing written.
func TestActionsOff(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.NotContains(t, page, `name="csrf"`)
	require.NotContains(t, page, `method="post"`)
	for _, action := range []string{"abort", "cancel", "wake", "emit"} {
		code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/%s", task.ID, action), url.Values{"name": {"x"}}, nil)
		require.Equal(t, http.StatusForbidden, code, action)
		require.Contains(t, body, "actions are disabled")
	}
	code, _, _ := b.post(t, "/conversation/abort", url.Values{"id": {b.conv}}, nil)
	require.Equal(t, http.StatusForbidden, code)
	got, err := b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status)
}

func TestActionsOn(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	csrf := token(t, page)
	path := fmt.Sprintf("/tasks/%d/abort", task.ID)
	status := func() arbortype.Status {
		got, err := b.engine.Get(b.ctx, task.ID)
		require.NoError(t, err)
		return got.Status
	}

	t.Run("refused without the token", func(t *testing.T) {
		code, body, _ := b.post(t, path, url.Values{"csrf": {"00" + csrf[2:]}}, nil)
		require.Equal(t, http.StatusForbidden, code)
		require.Contains(t, body, "token is missing or stale")
		require.Equal(t, arbortype.StatusPending, status())
	})
	t.Run("refused from another site", func(t *testing.T) {
		code, _, _ := b.post(t, path, url.Values{"csrf": {csrf}}, map[string]string{"Origin": "https://evil.example"})
		require.Equal(t, http.StatusForbidden, code)
		code, _, _ = b.post(t, path, url.Values{"csrf": {csrf}}, map[string]string{"Sec-Fetch-Site": "cross-site"})
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, arbortype.StatusPending, status())
	})
	t.Run("bad input writes nothing", func(t *testing.T) {
		code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", task.ID), url.Values{"csrf": {csrf}, "name": {"go"}, "payload": {"{not json"}}, nil)
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, body, "payload is not JSON")
		code, body, _ = b.post(t, fmt.Sprintf("/tasks/%d/wake", task.ID), url.Values{"csrf": {csrf}}, nil)
		require.Equal(t, http.StatusConflict, code, body)
		require.Contains(t, body, "not sleeping")
		code, _, _ = b.post(t, "/tasks/x/abort", url.Values{"csrf": {csrf}}, nil)
		require.Equal(t, http.StatusBadRequest, code)
		code, _, _ = b.post(t, fmt.Sprintf("/tasks/%d/explode", task.ID), url.Values{"csrf": {csrf}}, nil)
		require.Equal(t, http.StatusNotFound, code)
		require.Equal(t, arbortype.StatusPending, status())
		entries, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
		require.NoError(t, err)
		for _, en := range entries {
			require.NotEqual(t, arbortype.LogKindEvent, en.Kind, "no event was emitted")
		}
	})
	t.Run("emit, then abort with a reason", func(t *testing.T) {
		code, _, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", task.ID), url.Values{"csrf": {csrf}, "name": {"nudge"}, "payload": {`{"n": 1}`}}, nil)
		require.Equal(t, http.StatusSeeOther, code)
		code, _, to := b.post(t, path, url.Values{"csrf": {csrf}, "reason": {"user pressed stop"},
			"back": {"/conversation?id=" + url.QueryEscape(b.conv)}}, nil)
		require.Equal(t, http.StatusSeeOther, code)
		require.Equal(t, "/conversation?id="+url.QueryEscape(b.conv), to)
		got, err := b.engine.Get(b.ctx, task.ID)
		require.NoError(t, err)
		require.True(t, got.Status.Settled(), got.Status)
		require.Equal(t, "user pressed stop", got.Error.Message)
		code, body, _ := b.post(t, path, url.Values{"csrf": {csrf}}, nil)
		require.Equal(t, http.StatusConflict, code, "a settled task cannot be aborted: %s", body)
	})
	t.Run("a back address off the handler is not followed", func(t *testing.T) {
		other := b.create(t, arbortype.CreateParams{Kind: "turn", ConversationID: b.conv + "-2"})
		code, _, to := b.post(t, fmt.Sprintf("/tasks/%d/cancel", other.ID), url.Values{"csrf": {csrf}, "back": {"//evil.example/"}}, nil)
		require.Equal(t, http.StatusSeeOther, code)
		require.Equal(t, fmt.Sprintf("/tasks/%d", other.ID), to)
	})
}

// TestAnswerFormOfAnAwaitingTask: with actions on, an awaiting task's page
// renders its answer form, carrying the await's token, posting to the task.
func TestAnswerFormOfAnAwaitingTask(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	run, err := b.engine.Start(b.ctx, task.ID)
	require.NoError(t, err)
	res, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
	require.NoError(t, err)
	code, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `value="`+res.Task.AwaitToken+`"`)
	require.Contains(t, page, fmt.Sprintf(`action="/tasks/%d/emit"`, task.ID))
}

// TestAnswerOfAnAwaitThatEnded: the answer form carries its await's
// token; posted from a page left open after that await ended, it is
// refused (409, saying so) and nothing is emitted, so a later await of
// the name is not answered by it.
func TestAnswerOfAnAwaitThatEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, &arborui.Options{Actions: true})
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	await := func() string {
		run, err := b.engine.Start(b.ctx, task.ID)
		require.NoError(t, err)
		res, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
		require.NoError(t, err)
		return res.Task.AwaitToken
	}
	stale := await()
	_, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Contains(t, page, `value="`+stale+`"`, "the page left open holds the first await's form")
	csrf := token(t, page)
	_, err := b.engine.WakeNow(b.ctx, task.ID)
	require.NoError(t, err)
	live := await()

	code, body, _ := b.post(t, fmt.Sprintf("/tasks/%d/emit", task.ID), url.Values{"csrf": {csrf}, "token": {stale}, "payload": {`{"approved": true}`}}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "the await this token belongs to is over")
	got, err := b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusSleeping, got.Status, "the later await is not answered")

	code, body, _ = b.post(t, fmt.Sprintf("/tasks/%d/emit", task.ID), url.Values{"csrf": {csrf}, "token": {live}, "payload": {`{"approved": true}`}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	got, err = b.engine.Get(b.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status)
	require.JSONEq(t, `{"approved": true}`, string(got.Delivered.Payload))
}

// TestLogShowsWhyATaskSettled: a task's log on its page carries the
// settle's error code and message — an abort's reason.
func TestLogShowsWhyATaskSettled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	task := b.create(t, arbortype.CreateParams{Kind: "turn"})
	_, err := b.engine.Abort(b.ctx, task.ID, tasks.WithReason("the user pressed <stop>"))
	require.NoError(t, err)
	code, page := b.get(t, fmt.Sprintf("/tasks/%d", task.ID))
	require.Equal(t, http.StatusOK, code)
	i := strings.Index(page, `id="task-log"`)
	require.GreaterOrEqual(t, i, 0, "the page shows the log")
	require.Contains(t, page[i:], `<span class="why">aborted: the user pressed &lt;stop&gt;</span>`)
}
