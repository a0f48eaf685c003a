package machine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/arborhq/arbor/arborhttp"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// echoTurn answers a chat message {"text": …} with {"answer": …}.
func echoTurn(ctx context.Context, run *machine.Run) error {
	var msg struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(run.Task.Input, &msg); err != nil {
		return machine.NonRetryable(fmt.Errorf("the message is not {\"text\": …}: %w", err))
	}
	answer, err := json.Marshal(map[string]string{"answer": "you said: " + msg.Text})
	if err != nil {
		return err
	}
	return run.Complete(ctx, answer)
}

// postMessage is a chat backend's HTTP handler for POST
// /chats/{id}/messages: the body is the user's message, the turn answers
// it. The client's Idempotency-Key makes a retried request the same turn.
// The handler waits for the turn to settle (AwaitSettled follows the
// conversation's log, whichever node runs the turn), bounded by the
// request: a client that goes away stops the wait, not the turn.
func postMessage(engine *tasks.Engine) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		turn, _, err := engine.Create(r.Context(), arbortype.CreateParams{ConversationID: r.PathValue("id"), Kind: "turn",
			Input: body, IdempotencyKey: r.Header.Get("Idempotency-Key")})
		switch {
		case errors.Is(err, arbortype.ErrInvalidJSON), errors.Is(err, arbortype.ErrInvalidArgument), errors.Is(err, arbortype.ErrPayloadTooLarge):
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		defer cancel()
		settled, err := engine.AwaitSettled(ctx, turn.ID)
		if err != nil {
			http.Error(w, fmt.Sprintf("turn %d: %v", turn.ID, err), http.StatusGatewayTimeout)
			return
		}
		if settled.Status != arbortype.StatusCompleted {
			http.Error(w, fmt.Sprintf("turn %d %s", settled.ID, settled.Status), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write(settled.Result); err != nil {
			log.Printf("answer turn %d: %v", settled.ID, err)
		}
	}
}

// A chat backend's HTTP handler (postMessage): the request creates the
// turn and is answered with the turn's result once it has settled. The
// client sends its message twice (a retry after a timeout, with the same
// Idempotency-Key): one turn, the same answer.
func ExampleRunner_httpHandler() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_http")
	defer done()
	stop := startRunner(ctx, engine, map[string]machine.Handler{"turn": echoTurn})
	defer stop()

	mux := http.NewServeMux()
	mux.Handle("POST /chats/{id}/messages", postMessage(engine))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/chats/chat-40/messages", strings.NewReader(`{"text": "hello"}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "msg-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if cerr := resp.Body.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, string(body))
	}
	turns, err := engine.ConversationTasks(ctx, "chat-40")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("turns:", len(turns))
	// Output:
	// 200 {"answer": "you said: hello"}
	// 200 {"answer": "you said: hello"}
	// turns: 1
}

// sseEvent is one server-sent event as the client reads it.
type sseEvent struct {
	id, event string
	data      struct {
		Task    int64            `json:"task_id"`
		Name    string           `json:"name"`
		Status  arbortype.Status `json:"status"`
		Payload json.RawMessage  `json:"payload"`
	}
}

// readEvents reads server-sent events from r and calls fn with each until
// fn returns false or the stream ends.
func readEvents(r io.Reader, fn func(sseEvent) bool) error {
	sc := bufio.NewScanner(r)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if !fn(ev) {
				return nil
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

// A progress stream over server-sent events (arborhttp.Stream): the
// handler publishes the answer's tokens with Run.Progress; the client reads
// them as they commit, then the turn's settle, which ends the stream
// (?until=<the turn>).
func ExampleRun_Progress_serverSentEvents() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_sse")
	defer done()
	stop := startRunner(ctx, engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			for _, tok := range []string{`"Hel"`, `"lo, "`, `"world"`} {
				if err := run.Progress(ctx, "token", json.RawMessage(tok)); err != nil {
					return err
				}
			}
			return run.Complete(ctx, json.RawMessage(`"Hello, world"`))
		},
	})
	defer stop()

	mux := http.NewServeMux()
	mux.Handle("GET /chats/{id}/events", arborhttp.Stream(engine, func(r *http.Request) (string, error) {
		return r.PathValue("id"), nil
	}, nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "chat-41", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL+fmt.Sprintf("/chats/chat-41/events?until=%d", turn.ID), nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := resp.Body.Close(); err != nil {
			log.Print(err)
		}
	}()
	fmt.Println(resp.Header.Get("Content-Type"))
	err = readEvents(resp.Body, func(ev sseEvent) bool {
		switch {
		case ev.event == "progress":
			fmt.Println("token", string(ev.data.Payload))
		case ev.event == "status" && ev.data.Task == turn.ID && ev.data.Status.Settled():
			fmt.Println("turn", ev.data.Status) // the stream ends after it
		}
		return true
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// text/event-stream
	// token "Hel"
	// token "lo, "
	// token "world"
	// turn completed
}

// Edit and regenerate: the user edits their second message. The backend
// forks the conversation through the turn before it (Engine.Fork copies
// that history, results and all, into a new conversation), and the edited
// message is a new turn there, which the runner answers; the original
// conversation keeps its three turns.
func ExampleRunner_regenerate() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx, "arbor_example_regenerate")
	defer done()
	stop := startRunner(ctx, engine, map[string]machine.Handler{"turn": echoTurn})
	defer stop()

	say := func(conv, text string) arbortype.Task {
		input, err := json.Marshal(map[string]string{"text": text})
		if err != nil {
			log.Fatal(err)
		}
		turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Input: input})
		if err != nil {
			log.Fatal(err)
		}
		settled, err := engine.AwaitSettled(ctx, turn.ID)
		if err != nil {
			log.Fatal(err)
		}
		return settled
	}
	first := say("chat-43", "hello")
	say("chat-43", "what is arbor?")
	say("chat-43", "and River?")

	f, err := engine.Fork(ctx, tasks.ForkParams{ConversationID: "chat-43", ThroughTurn: first.ID, NewConversationID: "chat-43-edit"})
	if err != nil {
		log.Fatal(err)
	}
	edited := say(f.ConversationID, "what is arbor, in one line?")
	fmt.Println("regenerated:", edited.Status, string(edited.Result))

	for _, conv := range []string{"chat-43", f.ConversationID} {
		turns, err := engine.ConversationTasks(ctx, conv)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(conv, ":")
		for _, t := range turns {
			fmt.Print(" ", string(t.Input))
		}
		fmt.Println()
	}
	// Output:
	// regenerated: completed {"answer": "you said: what is arbor, in one line?"}
	// chat-43: {"text": "hello"} {"text": "what is arbor?"} {"text": "and River?"}
	// chat-43-edit: {"text": "hello"} {"text": "what is arbor, in one line?"}
}
