package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// TestMain fails the package if goroutines (a runner, a stream) outlive its
// tests.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

const operatorToken = "op-secret"

// bound ends a broken test's wait for a signal that never comes; no test
// asserts how long anything takes.
const bound = 2 * time.Minute

// setup serves the backend on a migrated schema of the test's own, with
// its handlers run by a Runner, and a session budget of tokens.
func setup(t *testing.T, tokens int64) *httptest.Server {
	t.Helper()
	pool, schema := arbortest.Database(t)
	engine, err := tasks.New(t.Context(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	runner, err := machine.NewRunner(engine, handlers(), &machine.RunnerConfig{})
	require.NoError(t, err)
	require.NoError(t, runner.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, runner.Stop(context.Background())) })
	h, err := newServer(engine, tokens, operatorToken)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close) // after the streams, which end with the test's context
	return srv
}

// event is one server-sent event of the conversation's stream.
type event struct {
	Event   string
	TaskID  int64            `json:"task_id"`
	Status  arbortype.Status `json:"status"`
	Name    string           `json:"name"`
	Payload json.RawMessage  `json:"payload"`
}

// awaits is the event a status entry says its task awaits ("" for none).
func (e event) awaits() string {
	var p struct{ Await string }
	_ = json.Unmarshal(e.Payload, &p)
	return p.Await
}

// stream is a client's EventSource on a conversation.
type stream struct {
	t      *testing.T
	events chan event
	seen   []event
}

// openStream opens a conversation's stream and returns once it is open:
// the server has answered with its headers.
func openStream(t *testing.T, srv *httptest.Server, conv string) *stream {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/conversations/"+conv+"/events", nil)
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	s := &stream{t: t, events: make(chan event, 1024)}
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev event
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && ev.Event != "":
				s.events <- ev
				ev = event{}
			case strings.HasPrefix(line, "event: "):
				ev.Event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) != nil {
					ev.Event = "unreadable: " + line
				}
			}
		}
	}()
	return s
}

// until reads events up to the first that match accepts, and returns those
// it read, that one last. The stream must not end or send an error first.
func (s *stream) until(match func(event) bool) []event {
	s.t.Helper()
	var read []event
	timeout := time.After(bound)
	for {
		select {
		case ev, ok := <-s.events:
			require.True(s.t, ok, "the stream ended; read %+v", read)
			require.NotContains(s.t, ev.Event, "error", "%+v", ev)
			read = append(read, ev)
			s.seen = append(s.seen, ev)
			if match(ev) {
				return read
			}
		case <-timeout:
			s.t.Fatalf("no such event; read %+v", read)
		}
	}
}

func (s *stream) next(match func(event) bool) event {
	read := s.until(match)
	return read[len(read)-1]
}

// status matches a status entry of a task (any task when id is 0).
func status(id int64, st arbortype.Status) func(event) bool {
	return func(e event) bool { return e.Event == "status" && (id == 0 || e.TaskID == id) && e.Status == st }
}

// awaiting matches a task parked on an await of name.
func awaiting(name string) func(event) bool {
	return func(e event) bool { return status(0, arbortype.StatusSleeping)(e) && e.awaits() == name }
}

// reply is a message's answer: the settled turn.
type reply struct {
	Code   int
	Turn   int64
	Status arbortype.Status
	Result struct{ Answer string }
	Error  *arbortype.TaskError
	Err    error
}

// post posts a message and answers on the channel once the request ends:
// the request waits for its turn to settle.
func post(t *testing.T, srv *httptest.Server, conv, text string) <-chan reply {
	t.Helper()
	out := make(chan reply, 1)
	body := fmt.Sprintf(`{"text": %q}`, text)
	go func() {
		var r reply
		resp, err := srv.Client().Post(srv.URL+"/conversations/"+conv+"/messages", "application/json", strings.NewReader(body))
		if err == nil {
			r.Code = resp.StatusCode
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
		}
		r.Err = err
		out <- r
	}()
	return out
}

// wait returns the reply, which must be 200.
func wait(t *testing.T, replies <-chan reply) reply {
	t.Helper()
	select {
	case r := <-replies:
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusOK, r.Code)
		return r
	case <-time.After(bound):
		t.Fatal("the message was never answered")
		return reply{}
	}
}

// do sends a request (as the operator with auth) and returns its status
// and body.
func do(t *testing.T, srv *httptest.Server, method, path, body string, auth bool) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if auth {
		req.SetBasicAuth("operator", operatorToken)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// tokenOf reads the token of the await of name the conversation's task id
// is parked in, from the backend's list of approvals.
func tokenOf(t *testing.T, srv *httptest.Server, conv string, id int64, name string) string {
	t.Helper()
	code, body := do(t, srv, http.MethodGet, "/conversations/"+conv+"/approvals", "", false)
	require.Equal(t, http.StatusOK, code, body)
	var pending []arbortype.PendingEvent
	require.NoError(t, json.Unmarshal([]byte(body), &pending))
	for _, p := range pending {
		if p.TaskID == id && p.Name == name {
			return p.Token
		}
	}
	t.Fatalf("task %d awaits no %q: %s", id, name, body)
	return ""
}

// The whole path of a message: the stream opened before the conversation
// exists; a turn that calls two tools and a sub-agent (whose child
// browses), asks for an approval and streams its answer; a second message
// posted mid-turn, queued and answered after the first.
func TestMessageApprovalAndQueuedMessage(t *testing.T) {
	t.Parallel()
	srv := setup(t, 20_000)
	s := openStream(t, srv, "c1")

	first := post(t, srv, "c1", "a refund please")
	read := s.until(awaiting("approval"))
	turn1 := read[len(read)-1].TaskID
	for _, kind := range []string{"search", "fetch", "research", "browse"} {
		require.True(t, containsEvent(read, func(e event) bool { return e.Name == kind && e.Status == arbortype.StatusCompleted }),
			"%s never completed before the approval: %+v", kind, read)
	}

	second := post(t, srv, "c1", "and hello")
	turn2 := s.next(func(e event) bool {
		return status(0, arbortype.StatusPending)(e) && e.Name == "turn" && e.TaskID != turn1
	}).TaskID

	token := tokenOf(t, srv, "c1", turn1, "approval")
	for range 2 { // a double click is one answer
		code, body := do(t, srv, http.MethodPost, "/approvals/"+token, `{"approved": true}`, false)
		require.Equal(t, http.StatusOK, code, body)
	}

	// The first turn streams its answer and completes before the queued
	// one starts.
	read = s.until(status(turn1, arbortype.StatusCompleted))
	require.True(t, containsEvent(read, func(e event) bool { return e.Event == "progress" && e.Name == "token" && e.TaskID == turn1 }))
	require.False(t, containsEvent(s.seen, status(turn2, arbortype.StatusRunning)), "the queued turn ran beside the live one")
	s.next(status(turn2, arbortype.StatusCompleted))

	r := wait(t, first)
	require.Equal(t, turn1, r.Turn)
	require.Equal(t, arbortype.StatusCompleted, r.Status)
	require.Contains(t, r.Result.Answer, "refund approved: true")
	require.Contains(t, r.Result.Answer, `search completed: "search done"; fetch completed: "fetch done"; research completed: "browse done"`)
	r = wait(t, second)
	require.Equal(t, turn2, r.Turn)
	require.Equal(t, arbortype.StatusCompleted, r.Status)
	require.NotContains(t, r.Result.Answer, "refund")

	// The token of a settled turn's await: its first answer again, no second.
	code, _ := do(t, srv, http.MethodPost, "/approvals/"+token, `{"approved": false}`, false)
	require.Equal(t, http.StatusOK, code)
}

func containsEvent(events []event, match func(event) bool) bool {
	for _, e := range events {
		if match(e) {
			return true
		}
	}
	return false
}

// Stop mid-turn: the turn awaiting its approval is aborted with the user's
// reason, and the message queued behind it runs next. A late answer to the
// aborted turn's approval is 410 (arborhttp.Status of ErrAwaitEnded). A
// later turn's approval, denied, is answered without the refund.
func TestStopMidTurn(t *testing.T) {
	t.Parallel()
	srv := setup(t, 20_000)
	s := openStream(t, srv, "c2")
	first := post(t, srv, "c2", "refund order 7")
	turn1 := s.next(awaiting("approval")).TaskID
	token := tokenOf(t, srv, "c2", turn1, "approval")
	second := post(t, srv, "c2", "never mind, hello")
	s.next(func(e event) bool {
		return status(0, arbortype.StatusPending)(e) && e.Name == "turn" && e.TaskID != turn1
	})

	code, body := do(t, srv, http.MethodPost, "/conversations/c2/stop", "", false)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"aborted": 1}`, body) // the turn alone: its tools and sub-agent had completed
	r := wait(t, first)
	require.Equal(t, arbortype.StatusAborted, r.Status)
	require.NotNil(t, r.Error)
	require.Equal(t, "the user pressed stop", r.Error.Message)
	r = wait(t, second)
	require.Equal(t, arbortype.StatusCompleted, r.Status)

	code, body = do(t, srv, http.MethodPost, "/approvals/"+token, `{"approved": true}`, false)
	require.Equal(t, http.StatusGone, code, body)
	code, body = do(t, srv, http.MethodPost, "/conversations/c2/stop", "", false) // nothing live: no error
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"aborted": 0}`, body)

	// Denied: the turn answers without the refund.
	third := post(t, srv, "c2", "refund order 8 after all")
	turn3 := s.next(awaiting("approval")).TaskID
	code, body = do(t, srv, http.MethodPost, "/approvals/"+tokenOf(t, srv, "c2", turn3, "approval"), `{"approved": false}`, false)
	require.Equal(t, http.StatusOK, code, body)
	r = wait(t, third)
	require.Equal(t, arbortype.StatusCompleted, r.Status)
	require.Contains(t, r.Result.Answer, "refund approved: false")
}

// A budget that parks: each turn reserves 500 tokens and uses 400, so the
// third of a 1,000-token session parks on arbor:budget until the operator
// raises the budget, and then answers.
func TestBudgetParksUntilRaised(t *testing.T) {
	t.Parallel()
	srv := setup(t, 1000)
	s := openStream(t, srv, "c3")
	for _, text := range []string{"one", "two"} {
		require.Equal(t, arbortype.StatusCompleted, wait(t, post(t, srv, "c3", text)).Status)
	}
	third := post(t, srv, "c3", "three")
	turn3 := s.next(awaiting(arbortype.BudgetEvent)).TaskID

	// Only a raise ends a budget's park: its token is refused (400).
	token := tokenOf(t, srv, "c3", turn3, arbortype.BudgetEvent)
	code, body := do(t, srv, http.MethodPost, "/approvals/"+token, `{"approved": true}`, false)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, _ = do(t, srv, http.MethodPost, "/conversations/c3/budget", `{"tokens": 3000}`, false)
	require.Equal(t, http.StatusUnauthorized, code)
	code, body = do(t, srv, http.MethodPost, "/conversations/c3/budget", `{"tokens": 3000}`, true)
	require.Equal(t, http.StatusOK, code, body)

	r := wait(t, third)
	require.Equal(t, turn3, r.Turn)
	require.Equal(t, arbortype.StatusCompleted, r.Status)
}

// Errors are arbor's, answered with arborhttp.Status; the web view is the
// operator's.
func TestErrorsAndWebView(t *testing.T) {
	t.Parallel()
	srv := setup(t, 20_000)
	for _, c := range []struct {
		method, path, body string
		code               int
		message            string
	}{
		{http.MethodPost, "/conversations/c4/messages", "not JSON", http.StatusBadRequest, "invalid JSON"},
		{http.MethodGet, "/conversations/nobody/approvals", "", http.StatusNotFound, "not found"},
		{http.MethodPost, "/approvals/awt_no_such_token", `{"approved": true}`, http.StatusNotFound, "not found"},
		{http.MethodPost, "/conversations/nobody/stop", "", http.StatusNotFound, "not found"},
		{http.MethodPost, "/conversations/nobody/budget", `{"tokens": 10}`, http.StatusNotFound, "not found"},
	} {
		code, body := do(t, srv, c.method, c.path, c.body, true)
		require.Equal(t, c.code, code, "%s %s: %s", c.method, c.path, body)
		require.Equal(t, c.message+"\n", body, "%s %s", c.method, c.path)
	}

	code, _ := do(t, srv, http.MethodGet, "/arbor/", "", false)
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := do(t, srv, http.MethodGet, "/arbor/", "", true)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "<html")
}
