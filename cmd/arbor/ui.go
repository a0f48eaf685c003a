package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

const uiHelp = `Usage: arbor ui [flags]

Serves arbor's web view (package arborui), live: every conversation, a
page at a time, filtered; each conversation's task tree beside its log;
every task's record (attempts and errors, checkpoint, events, budgets,
trace); the approvals awaiting an answer; the nodes and what they hold.
It is read-only unless --actions is given: then the pages offer abort
(with a reason), cancel, wake, emit and the answer of an approval.
The view authenticates nobody: keep --addr on the loopback interface, or
mount arborui.NewHandler behind your own authentication. It answers only
requests that name an IP address, localhost, --addr's host or an
--allowed-host (a page of another site whose name resolves to this
address is refused: DNS rebinding).

--demo migrates the schema, runs the demo's handlers in this process and
starts a few of the demo's conversations (a turn that fans out to tool
calls, a research turn whose sub-agent browses until stopped, a turn
awaiting a human's approval), so that there is something live to look at:
what "make ui" runs, on a throwaway PostgreSQL.

Example:
  make ui                              (a throwaway PostgreSQL, the demo's work, actions on)
  arbor ui --addr 127.0.0.1:8080
  arbor ui --actions
  arbor ui --addr 0.0.0.0:8080 --allowed-host arbor.internal
  arbor ui --trace-url 'https://grafana.example/explore?traceId={trace_id}'
`

func cmdUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ui", uiHelp, stderr)
	var db dbFlags
	db.register(fs)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	actions := fs.Bool("actions", false, "offer and accept actions (abort, cancel, wake, emit)")
	withDemo := fs.Bool("demo", false, "migrate, run the demo's handlers here and start its conversations")
	traceURL := fs.String("trace-url", "", "link each task's trace id to your tracing UI: an http(s) address holding {trace_id}")
	var hosts []string
	fs.Func("allowed-host", "a host name the view answers besides IP addresses, localhost and --addr's host (repeat it, or separate names with commas)",
		func(v string) error {
			for h := range strings.SplitSeq(v, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hosts = append(hosts, h)
				}
			}
			return nil
		})
	if _, err := parseArgs(fs, args, 0, 0, ""); err != nil {
		return err
	}
	// The host --addr names is one the view serves.
	if h, _, err := net.SplitHostPort(*addr); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	if *withDemo {
		pool, err := db.connect(ctx)
		if err != nil {
			return err
		}
		m, err := migrations.New(pool.unpooled(), db.schema, nil)
		if err == nil {
			_, err = m.Up(ctx)
		}
		pool.Close()
		if err != nil {
			return err
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := arborui.NewHandler(engine.Engine, &arborui.Options{Actions: *actions, AllowedHosts: hosts, TraceURL: *traceURL, Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	if *withDemo {
		stopRunner, err := uiDemo(ctx, engine.Engine, logger)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopRunner()
	}
	mode := "read-only"
	if *actions {
		mode = "actions on"
	}
	fmt.Fprintf(stdout, "arbor ui (%s) on http://%s/ — Ctrl-C stops it\n", mode, ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	// The live streams end with their requests' contexts; Shutdown waits
	// for them no longer than this.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("ui: %w", err)
	}
	return nil
}

// uiDemo starts a runner of the demo's handlers in this process and the
// demo's conversations for it to run; the function it returns stops the
// runner.
func uiDemo(ctx context.Context, engine *tasks.Engine, logger *slog.Logger) (func(), error) {
	runner, err := machine.NewRunner(engine, demoHandlers(), &machine.RunnerConfig{Logger: logger})
	if err != nil {
		return nil, err
	}
	if err := runner.Start(ctx); err != nil {
		return nil, err
	}
	stamp := time.Now().Format("150405")
	for _, mode := range []string{"", "research", "approval"} {
		name := mode
		if name == "" {
			name = "tools"
		}
		input, _ := json.Marshal(map[string]string{"mode": mode})
		if _, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: "ui-demo-" + name + "-" + stamp,
			Kind: "chat_turn", Input: input}); err != nil {
			_ = runner.Stop(context.Background())
			return nil, err
		}
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = runner.Stop(sctx)
	}, nil
}
