// Command chatbackend is a chat backend on arbor, whole: copy it and put
// your model and tools where the fakes are. A message is a turn; the turn
// calls two tools in parallel and a sub-agent (which has a child of its
// own), may ask a human for an approval, streams its answer, and spends a
// session budget of tokens that parks it when it runs out.
//
//	ARBOR_DATABASE_URL=postgres://… go run ./examples/chatbackend --addr 127.0.0.1:8080
//
//	curl -N localhost:8080/conversations/c1/events &              # progress, as server-sent events
//	curl -d '{"text": "a refund please"}' localhost:8080/conversations/c1/messages   # waits for the answer
//	curl localhost:8080/conversations/c1/approvals                 # what the turn awaits, with its token
//	curl -d '{"approved": true}' localhost:8080/approvals/awt_…    # the user's answer
//	curl -X POST localhost:8080/conversations/c1/stop              # the user pressed stop
//
// The operator's routes — the web view at /arbor/ and the budget's raise —
// take the operator token ($CHAT_OPERATOR_TOKEN, or one printed at start)
// as a basic-auth password. Authenticating your users is yours to add.
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
	schema := flag.String("schema", migrations.SchemaDefault, "schema of arbor's tables")
	tokens := flag.Int64("tokens", 20_000, "each conversation's budget of model tokens; a turn over it parks until an operator raises it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *schema, *tokens); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr, schema string, tokens int64) error {
	url := os.Getenv("ARBOR_DATABASE_URL")
	if url == "" {
		return errors.New("set ARBOR_DATABASE_URL to a PostgreSQL database (a direct connection: migrations take a session lock)")
	}
	pool, err := pgxpool.New(ctx, url) // serves our calls; the Runner makes pools of its own
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil { // arbor's tables and River's; a no-op when up to date
		return err
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
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
	var hosts []string // the view answers IP addresses, localhost and --addr's host
	if host, _, _ := net.SplitHostPort(addr); host != "" {
		hosts = append(hosts, host)
	}
	h, err := newServer(engine, tokens, operator, hosts)
	if err != nil {
		return err
	}
	// Requests inherit ctx, so that the event streams end at Ctrl-C and
	// Shutdown does not wait for them.
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Printf("chat backend on http://%s/ (web view at /arbor/)", addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newServer routes the chat's HTTP API and the operator's web view. tokens
// is each conversation's budget; operator the operator's password; hosts
// the names the web view answers besides IP addresses and localhost.
func newServer(engine *tasks.Engine, tokens int64, operator string, hosts []string) (http.Handler, error) {
	// Behind the operator's password the view may act (abort, answer an
	// approval): it still refuses a POST without its own CSRF token or from
	// another origin, and a request naming a host it does not serve.
	ui, err := arborui.NewHandler(engine, &arborui.Options{Prefix: "/arbor", Actions: true, AllowedHosts: hosts})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/arbor/", operatorOnly(operator, ui))
	// The stream may be opened before the first message: it waits for the
	// conversation. ?until=<turn> ends it at that turn's settle.
	mux.Handle("GET /conversations/{id}/events", arborhttp.Stream(engine,
		func(r *http.Request) (string, error) { return r.PathValue("id"), nil }, nil))

	mux.HandleFunc("POST /conversations/{id}/messages", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			fail(w, r, err)
			return
		}
		// A message mid-turn is queued: it becomes a turn that starts when
		// the live one settles (one turn of a conversation runs at a time,
		// oldest first). The first create sets the session's budget.
		turn, _, err := engine.Create(r.Context(), arbortype.CreateParams{ConversationID: r.PathValue("id"), Kind: "turn",
			Input: body, IdempotencyKey: r.Header.Get("Idempotency-Key"), OnBusy: arbortype.TurnQueue,
			ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: tokens, OnExhausted: arbortype.BudgetPark}}})
		if err != nil {
			fail(w, r, err) // bad JSON 400, a retried key reused for another message 409…
			return
		}
		// A client that goes stops this wait, not the turn: its answer
		// stays in the log and in the turn's row.
		settled, err := engine.AwaitSettled(r.Context(), turn.ID)
		if err != nil {
			fail(w, r, err)
			return
		}
		writeJSON(w, r, map[string]any{"turn": settled.ID, "status": settled.Status, "result": settled.Result, "error": settled.Error})
	})

	mux.HandleFunc("GET /conversations/{id}/approvals", func(w http.ResponseWriter, r *http.Request) {
		pending, err := engine.PendingEvents(r.Context(), r.PathValue("id")) // at any depth of the tree
		if err != nil {
			fail(w, r, err)
			return
		}
		writeJSON(w, r, pending)
	})

	mux.HandleFunc("POST /approvals/{token}", func(w http.ResponseWriter, r *http.Request) {
		var answer struct {
			Approved *bool `json:"approved"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&answer); err != nil || answer.Approved == nil {
			http.Error(w, `the body is {"approved": true|false}`, http.StatusBadRequest)
			return
		}
		// One answer however often the user clicks; a click after the
		// await ended is 410, nothing written.
		payload := json.RawMessage(fmt.Sprintf(`{"approved": %t}`, *answer.Approved))
		if _, _, err := engine.EmitToken(r.Context(), r.PathValue("token"), payload); err != nil {
			fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})

	mux.HandleFunc("POST /conversations/{id}/stop", func(w http.ResponseWriter, r *http.Request) {
		// The turn under way with its subtree, leaves first; the turns
		// queued behind it stay, and the next one runs.
		if _, err := engine.AbortTurn(r.Context(), r.PathValue("id"), tasks.WithReason("the user pressed stop")); err != nil {
			fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})

	// Raising the budget lets a turn parked on it run again.
	mux.Handle("POST /conversations/{id}/budget", operatorOnly(operator, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Tokens int64 }
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&b); err != nil {
			http.Error(w, `the body is {"tokens": n}`, http.StatusBadRequest)
			return
		}
		budget, err := engine.SetBudget(r.Context(), tasks.BudgetParams{ConversationID: r.PathValue("id"), Counter: "tokens",
			Max: b.Tokens, OnExhausted: arbortype.BudgetPark})
		if err != nil {
			fail(w, r, err)
			return
		}
		writeJSON(w, r, budget)
	})))
	return mux, nil
}

// handlers are the runner's: one per task kind.
func handlers() map[string]machine.Handler {
	tool := func(what string) machine.Handler { // a tool call, faked
		return func(ctx context.Context, run *machine.Run) error {
			return run.Complete(ctx, jsonOf(what+" for "+string(run.Task.Input)))
		}
	}
	return map[string]machine.Handler{"turn": turn, "research": research,
		"search": tool("3 results"), "fetch": tool("1 page"), "browse": tool("2 pages read")}
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
		query := jsonOf(msg.Text)
		kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "search", Input: query},
			{Kind: "fetch", Input: query}, {Kind: "research", Input: query}})
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
		var found []string
		for _, k := range kids {
			found = append(found, fmt.Sprintf("%s %s: %s", k.Kind, k.Status, k.Result))
		}
		draft := strings.Join(found, "; ")
		if !strings.Contains(msg.Text, "refund") {
			return answer(ctx, run, draft)
		}
		// A side effect a human approves first: park until the answer
		// comes (EmitToken), with the draft saved beside the await.
		return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approval", Timeout: 24 * time.Hour, Phase: "decided", State: jsonOf(draft)})
	case "decided":
		var draft string
		var decision struct{ Approved bool }
		if err := json.Unmarshal(run.Task.State, &draft); err != nil {
			return machine.NonRetryable(err)
		}
		if d := run.Task.Delivered; d != nil && !d.TimedOut {
			if err := json.Unmarshal(d.Payload, &decision); err != nil {
				return machine.NonRetryable(err)
			}
		}
		if decision.Approved {
			return answer(ctx, run, "refund approved; "+draft)
		}
		return answer(ctx, run, "refund not approved; "+draft)
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

// fail answers err with its status and short message (arborhttp.Status),
// and logs err itself: its text may name tables or rows.
func fail(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := arborhttp.Status(err)
	log.Printf("%s %s: %d: %v", r.Method, r.URL.Path, status, err)
	http.Error(w, msg, status)
}

func writeJSON(w http.ResponseWriter, r *http.Request, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	}
}

// jsonOf marshals what cannot fail to marshal (strings and maps of them).
func jsonOf(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
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
