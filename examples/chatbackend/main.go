// Command chatbackend is a chat backend on arbor, whole: copy it and put
// your model and tools where the fakes are. A message is a turn, which calls
// two tools and a sub-agent (with a child of its own) side by side, may ask
// a human's approval, streams its answer and spends a session's budget of
// tokens, parked when it runs out until an operator raises it.
//
//	ARBOR_DATABASE_URL=postgres://… go run ./examples/chatbackend --addr 127.0.0.1:8080
//	curl -N localhost:8080/conversations/c1/events &                                # the progress
//	curl -d '{"text": "a refund please"}' localhost:8080/conversations/c1/messages  # waits for the answer
//	curl localhost:8080/conversations/c1/approvals                                # what it awaits, with tokens
//	curl -d '{"approved": true}' localhost:8080/approvals/awt_…                   # the user's answer
//	curl -X POST localhost:8080/conversations/c1/stop                             # the user pressed stop
//
// The web view (/arbor/) and the budget's raise take the operator token
// ($CHAT_OPERATOR_TOKEN, or one printed at start) as a basic-auth password;
// authenticating your users is yours to add.
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arborhttp"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	tokens := flag.Int64("tokens", 20_000, "each conversation's budget of model tokens; a turn over it parks until an operator raises it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *tokens); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr string, tokens int64) error {
	// A direct connection, not through PgBouncer: the migrations take a
	// session lock. The pool serves our calls; a Runner makes its own.
	pool, err := pgxpool.New(ctx, os.Getenv("ARBOR_DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, "arbor", nil)
	if err == nil {
		_, err = m.Up(ctx) // arbor's tables and River's; a no-op when up to date
	}
	if err != nil {
		return err
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: "arbor"})
	if err != nil {
		return err
	}
	runner, err := machine.NewRunner(engine, handlers(), &machine.RunnerConfig{})
	if err != nil {
		return err
	}
	if err := runner.Start(ctx); err != nil {
		return err
	}
	defer func() { // after the server: drains the handlers for ShutdownGrace
		if err := runner.Stop(context.WithoutCancel(ctx)); err != nil {
			log.Print(err)
		}
	}()
	operator := os.Getenv("CHAT_OPERATOR_TOKEN")
	if operator == "" {
		operator = rand.Text()
		log.Printf("operator token (the web view's password): %s", operator)
	}
	h, err := newServer(engine, tokens, operator)
	if err != nil {
		return err
	}
	// Requests inherit ctx: the event streams end at Ctrl-C, not holding up Shutdown.
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	context.AfterFunc(ctx, func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) })
	log.Printf("chat backend on http://%s/ (web view at /arbor/)", addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newServer routes the chat's HTTP API and the operator's web view. tokens
// is each conversation's budget; operator the operator's password.
func newServer(engine *tasks.Engine, tokens int64, operator string) (http.Handler, error) {
	// Behind the operator's password the view may act (abort, answer an
	// approval), on a POST from its own origin with its own CSRF token. It
	// answers IP addresses and localhost: reached by a name, list it in AllowedHosts.
	ui, err := arborui.NewHandler(engine, &arborui.Options{Prefix: "/arbor", Actions: true})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/arbor/", operatorOnly(operator, ui))
	// The stream may be opened before the first message: it waits for the
	// conversation. ?until=<turn> ends it at that turn's settle.
	mux.Handle("GET /conversations/{id}/events", arborhttp.Stream(engine,
		func(r *http.Request) (string, error) { return r.PathValue("id"), nil }, nil))
	mux.Handle("POST /conversations/{id}/messages", api(func(r *http.Request) (any, error) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			return nil, err
		}
		// A message mid-turn is queued: it becomes a turn that starts when
		// the live one settles (one turn of a conversation runs at a time,
		// oldest first). The first create sets the session's budget.
		turn, _, err := engine.Create(r.Context(), arbortype.CreateParams{ConversationID: r.PathValue("id"), Kind: "turn",
			Input: body, IdempotencyKey: r.Header.Get("Idempotency-Key"), OnBusy: arbortype.TurnQueue,
			ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: tokens, OnExhausted: arbortype.BudgetPark}}})
		if err != nil {
			return nil, err // not JSON: 400; a retry's key reused for another message: 409…
		}
		// A client that goes stops this wait, not the turn: its answer
		// stays in the turn's row and the conversation's log.
		settled, err := engine.AwaitSettled(r.Context(), turn.ID)
		return map[string]any{"turn": settled.ID, "status": settled.Status, "result": settled.Result, "error": settled.Error}, err
	}))
	mux.Handle("GET /conversations/{id}/approvals", api(func(r *http.Request) (any, error) {
		return engine.PendingEvents(r.Context(), r.PathValue("id")) // at any depth, each with its token
	}))
	mux.Handle("POST /approvals/{token}", api(func(r *http.Request) (any, error) {
		var answer struct{ Approved *bool }
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&answer); err != nil || answer.Approved == nil {
			return nil, fmt.Errorf(`%w: the body is {"approved": true|false}`, arbortype.ErrInvalidJSON)
		}
		// One answer however often the user clicks; a click after the
		// await ended is 410, and nothing is written.
		ev, _, err := engine.EmitToken(r.Context(), r.PathValue("token"), jsonOf(map[string]bool{"approved": *answer.Approved}))
		return map[string]int64{"event": ev.ID}, err
	}))
	mux.Handle("POST /conversations/{id}/stop", api(func(r *http.Request) (any, error) {
		// The turn under way with its subtree, leaves first; the turns
		// queued behind it stay, and the next one runs.
		report, err := engine.AbortTurn(r.Context(), r.PathValue("id"), tasks.WithReason("the user pressed stop"))
		return map[string]int{"aborted": len(report.Settled)}, err // 0: nothing was live
	}))
	// The operator raises a session's budget: a turn parked on it runs
	// again from its last checkpoint.
	mux.Handle("POST /conversations/{id}/budget", operatorOnly(operator, api(func(r *http.Request) (any, error) {
		var b struct{ Tokens int64 }
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&b); err != nil {
			return nil, fmt.Errorf(`%w: the body is {"tokens": n}`, arbortype.ErrInvalidJSON)
		}
		return engine.SetBudget(r.Context(), tasks.BudgetParams{ConversationID: r.PathValue("id"), Counter: "tokens",
			Max: b.Tokens, OnExhausted: arbortype.BudgetPark})
	})))
	return mux, nil
}

// handlers are the runner's: one per task kind.
func handlers() map[string]machine.Handler {
	tool := func(ctx context.Context, run *machine.Run) error { // a tool call on run.Task.Input, faked
		return run.Complete(ctx, jsonOf(run.Task.Kind+" done"))
	}
	return map[string]machine.Handler{"turn": turn, "research": research, "search": tool, "fetch": tool, "browse": tool}
}

// turn answers a message {"text": …}. It runs once per phase: each Wait or
// AwaitEvent parks it, and it runs again from the phase it names.
func turn(ctx context.Context, run *machine.Run) error {
	var msg struct{ Text string }
	if err := json.Unmarshal(run.Task.Input, &msg); err != nil || msg.Text == "" {
		return machine.NonRetryable(errors.New(`the message is not {"text": "…"}`))
	}
	switch run.Task.Phase {
	case "": // the model plans; the tools and the sub-agent run side by side
		// Reserve the call's most, record what it used. Over the session's
		// budget this parks the turn (the error is returned as is): it runs
		// again from here once an operator raises the budget.
		res, err := run.Reserve(ctx, "tokens", 500)
		if err != nil {
			return err
		}
		if err := run.Record(ctx, res, 400); err != nil {
			return err
		}
		in := run.Task.Input
		kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "search", Input: in}, {Kind: "fetch", Input: in},
			{Kind: "research", Input: in}})
		if err != nil {
			return err
		}
		// all_settled: a tool that fails does not stop the answer.
		return run.Wait(ctx, machine.WaitParams{ChildIDs: machine.IDs(kids), Policy: arbortype.AllSettled, Phase: "gathered"})
	case "gathered":
		kids, err := run.Waited(ctx)
		if err != nil {
			return err
		}
		draft := "" // what the model would make of the outcomes
		for _, k := range kids {
			draft += fmt.Sprintf("%s %s: %s; ", k.Kind, k.Status, k.Result)
		}
		if !strings.Contains(msg.Text, "refund") {
			return answer(ctx, run, draft)
		}
		// A side effect a human approves first: park until the answer
		// comes (EmitToken), with the draft saved beside the await.
		return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Timeout: 24 * time.Hour, Phase: "decided", State: jsonOf(draft)})
	case "decided": // the human answered, or a day passed: not approved
		var draft string
		var decision struct{ Approved bool }
		d := run.Task.Delivered
		if json.Unmarshal(run.Task.State, &draft) != nil || !d.TimedOut && json.Unmarshal(d.Payload, &decision) != nil {
			return machine.NonRetryable(errors.New("the draft or the approval is not JSON of its shape"))
		}
		return answer(ctx, run, fmt.Sprintf("refund approved: %t; %s", decision.Approved, draft))
	}
	return machine.NonRetryable(fmt.Errorf("unknown phase %q", run.Task.Phase))
}

// answer streams the answer a word at a time on the conversation's log
// (what the events stream sends), then completes the turn with it.
func answer(ctx context.Context, run *machine.Run, text string) error {
	for _, word := range strings.Fields(text) {
		if err := run.Progress(ctx, "token", jsonOf(word)); err != nil {
			return err
		}
	}
	return run.Complete(ctx, jsonOf(map[string]string{"answer": text}))
}

// research is a sub-agent: it browses (a child of its own) and reports.
func research(ctx context.Context, run *machine.Run) error {
	if run.Task.Phase == "read" {
		kids, err := run.Waited(ctx)
		if err != nil {
			return err
		}
		return run.Complete(ctx, kids[0].Result)
	}
	kid, err := run.Spawn(ctx, machine.SpawnParams{Kind: "browse", Input: run.Task.Input})
	if err != nil {
		return err
	}
	return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled, Phase: "read"})
}

// api adapts a handler that returns a reply or an error: the reply is
// sent as JSON; the error is answered with arborhttp.Status's status and
// short message, and logged itself (its text may name tables or rows).
func api(h func(r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply, err := h(r)
		if err != nil {
			status, msg := arborhttp.Status(err)
			log.Printf("%s %s: %d: %v", r.Method, r.URL.Path, status, err)
			http.Error(w, msg, status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(reply) // an error here is the client gone
	})
}

// jsonOf marshals strings and maps of them, which never fail to marshal.
func jsonOf(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// operatorOnly lets through a request whose basic-auth password is the
// operator token (a browser asks for it).
func operatorOnly(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pass, _ := r.BasicAuth(); subtle.ConstantTimeCompare([]byte(pass), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="operator"`)
			http.Error(w, "operator only", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
