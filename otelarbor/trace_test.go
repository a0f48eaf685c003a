package otelarbor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/otelarbor"
	"github.com/arborhq/arbor/tasks"
)

// The test binary doubles as a runner process: re-executed with
// OTELARBOR_CHILD set, it runs a Runner with treeHandlers, its spans written
// to a file as they end, until it is killed.
func TestMain(m *testing.M) {
	if os.Getenv("OTELARBOR_CHILD") != "" {
		os.Exit(runChild())
	}
	os.Exit(testdb.Main(m))
}

// The tree: a turn spawns an agent and waits for it; the agent spawns a
// tool and waits for it; the tool completes — except in the child process,
// where it blocks until the process is killed.
func treeHandlers(blockTool bool) map[string]machine.Handler {
	parent := func(child string) machine.Handler {
		return func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "waited" {
				return run.Complete(ctx, json.RawMessage(`"done"`))
			}
			// A key of the handler's own (keys are per conversation): a
			// parent run again after the crash gets its first child back
			// rather than a second one.
			kid, err := run.Spawn(ctx, machine.SpawnParams{Kind: child, IdempotencyKey: "spawn-" + child})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kid.ID}, Policy: arbortype.AllSettled, Phase: "waited"})
		}
	}
	return map[string]machine.Handler{
		"turn":  parent("agent"),
		"agent": parent("tool"),
		"tool": func(ctx context.Context, run *machine.Run) error {
			if blockTool {
				<-ctx.Done()
				return context.Cause(ctx)
			}
			return run.Complete(ctx, json.RawMessage(`"tool result"`))
		},
	}
}

func runnerConfig(node string, mw *otelarbor.Middleware) *machine.RunnerConfig {
	return &machine.RunnerConfig{
		NodeID:            node,
		Workers:           8,
		ConversationLease: time.Second,
		PollInterval:      50 * time.Millisecond,
		ShutdownGrace:     5 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true},
		Middleware:        []machine.Middleware{mw},
		Observer:          mw,
	}
}

// spanLine is a finished span as the child writes it.
type spanLine struct {
	Name     string         `json:"name"`
	TraceID  string         `json:"trace_id"`
	SpanID   string         `json:"span_id"`
	ParentID string         `json:"parent_id"`
	Attrs    map[string]any `json:"attrs"`
	Events   []string       `json:"events"`
}

func lineOf(s sdktrace.ReadOnlySpan) spanLine {
	l := spanLine{Name: s.Name(), TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
		Attrs: map[string]any{}}
	if s.Parent().IsValid() {
		l.ParentID = s.Parent().SpanID().String()
	}
	for _, kv := range s.Attributes() {
		l.Attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	for _, ev := range s.Events() {
		l.Events = append(l.Events, ev.Name)
	}
	return l
}

// fileExporter writes each finished span as a line of JSON.
type fileExporter struct {
	mu sync.Mutex
	f  *os.File
}

func (e *fileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range spans {
		b, err := json.Marshal(lineOf(s))
		if err != nil {
			return err
		}
		if _, err := e.f.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	return e.f.Sync()
}

func (e *fileExporter) Shutdown(context.Context) error { return nil }

func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	f, err := os.OpenFile(os.Getenv("OTELARBOR_SPANS"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(&fileExporter{f: f}))
	mw, err := otelarbor.NewMiddleware(&otelarbor.Config{TracerProvider: tp})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(testdb.EnvURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: os.Getenv("OTELARBOR_SCHEMA"), TraceInjector: mw})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	runner, err := machine.NewRunner(engine, treeHandlers(true), runnerConfig("node-a", mw))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := runner.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("runner started")
	<-ctx.Done()
	return 0
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTreeIsOneTraceAcrossACrash: a three-level tree (turn → agent → tool)
// is created inside a request's span and run by a runner in another
// process, which is killed (SIGKILL) while the tool runs; a runner here
// takes the conversation over when its lease expires and finishes the tree.
// Every run's span is in the request's trace; each task's run spans have
// as parent the span context stored with the task (the request's for the
// turn, the owner's run span for the others), the recovered tool's attempt
// included; and the metrics count the settles and the take-over.
func TestTreeIsOneTraceAcrossACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)

	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	mw, err := otelarbor.NewMiddleware(&otelarbor.Config{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TraceInjector: mw})
	require.NoError(t, err)

	// The request that starts the turn.
	reqCtx, req := tp.Tracer("test").Start(ctx, "POST /messages")
	conv := testdb.Conversation(t)
	turn, _, err := engine.Create(reqCtx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	req.End()
	require.Equal(t, req.SpanContext().TraceID().String(), traceparent(t, turn.Trace).trace)
	require.Equal(t, req.SpanContext().SpanID().String(), traceparent(t, turn.Trace).span)

	// Runner A, in a process of its own, runs until the tool is running.
	spansFile := filepath.Join(t.TempDir(), "spans.jsonl")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OTELARBOR_CHILD=1", "OTELARBOR_SCHEMA="+schema, "OTELARBOR_SPANS="+spansFile)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "runner started"), line)

	status := func(kind string) string {
		var s string
		err := pool.QueryRow(ctx, `SELECT status FROM `+schema+`.tasks WHERE conversation_id = $1 AND kind = $2`, conv, kind).Scan(&s)
		if err != nil {
			return ""
		}
		return s
	}
	// The kill comes while the tool runs and its owners wait on it (a
	// parent killed between its spawn and its wait is run again, and gets
	// its child back by the spawn's key), once the owners' first runs have
	// ended in the child and their spans are in its file: a wait commits
	// before its handler returns and its run's span ends, so a kill right
	// after the commit could cut the span (a loaded CI run saw the agent's
	// missing).
	exported := func(name string) bool {
		raw, err := os.ReadFile(spansFile)
		if err != nil {
			return false
		}
		for l := range strings.SplitSeq(string(raw), "\n") {
			var s spanLine
			if json.Unmarshal([]byte(l), &s) == nil && s.Name == name {
				return true
			}
		}
		return false
	}
	waitUntil(t, "the tool to run in the child, its owners waiting and their runs' spans exported", func() bool {
		return status("tool") == "running" && status("agent") == "waiting" && status("turn") == "waiting" &&
			exported("agent") && exported("turn")
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	// Runner B takes over once the child's lease lapses.
	r, err := machine.NewRunner(engine, treeHandlers(false), runnerConfig("node-b", mw))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	waitUntil(t, "the turn to complete", func() bool { return status("turn") == "completed" })
	require.NoError(t, r.Stop(ctx))

	all, err := engine.ConversationTasks(ctx, conv)
	require.NoError(t, err)
	byKind := map[string]arbortype.Task{}
	for _, task := range all {
		byKind[task.Kind] = task
		require.Equal(t, arbortype.StatusCompleted, task.Status, "task %d (%s)", task.ID, task.Kind)
	}
	require.Equal(t, 1, byKind["tool"].Attempt, "the tool was recovered once: %+v", byKind["tool"])

	// The spans: the child's (the runs that ended before the kill) and ours.
	var spans []spanLine
	raw, err := os.ReadFile(spansFile)
	require.NoError(t, err)
	for l := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		var s spanLine
		require.NoError(t, json.Unmarshal([]byte(l), &s))
		s.Attrs["process"] = "child"
		spans = append(spans, s)
	}
	for _, s := range exporter.GetSpans().Snapshots() {
		l := lineOf(s)
		l.Attrs["process"] = "parent"
		spans = append(spans, l)
	}
	runs := map[string][]spanLine{}
	fenced := map[string][]spanLine{} // runs the child's own fence stopped
	for _, s := range spans {
		require.Equal(t, req.SpanContext().TraceID().String(), s.TraceID, "span %s is in the request's trace", s.Name)
		if s.Name == "POST /messages" {
			continue
		}
		runs[s.Name] = append(runs[s.Name], s)
		// On a starved machine the child's renewer can miss its 1 s lease:
		// its fence stops the runs (no outcome, the reason says so) and
		// the child runs them again once its lease is confirmed. Such a
		// run is a span of the trace like any other; it is not counted
		// among the runs below.
		if reason, _ := s.Attrs[string(otelarbor.AttrReason)].(string); s.Attrs[string(otelarbor.AttrOutcome)] == "none" &&
			strings.HasPrefix(reason, "lease lost") {
			require.Equal(t, "child", s.Attrs["process"], "a fenced run of %s", s.Name)
			fenced[s.Name] = append(fenced[s.Name], s)
		}
	}
	// turn: its first run in the child, its second (after the wait) here;
	// agent likewise; tool: its first run died with the child (never
	// ended, never exported), its recovered attempt ran here.
	require.Len(t, runs["turn"], 2+len(fenced["turn"]))
	require.Len(t, runs["agent"], 2+len(fenced["agent"]))
	require.Len(t, runs["tool"], 1+len(fenced["tool"]))
	for kind, rs := range runs {
		stored := traceparent(t, byKind[kind].Trace)
		require.Equal(t, req.SpanContext().TraceID().String(), stored.trace, "%s's stored trace", kind)
		for _, s := range rs {
			require.Equal(t, stored.span, s.ParentID, "a run of %s is a child of the span stored with it", kind)
			require.EqualValues(t, byKind[kind].ID, s.Attrs[string(otelarbor.AttrTaskID)])
			require.Equal(t, conv, s.Attrs[string(otelarbor.AttrConversationID)])
		}
	}
	require.Equal(t, req.SpanContext().SpanID().String(), traceparent(t, byKind["turn"].Trace).span)
	// Each child was spawned in its owner's first run, in the child process
	// (or in a run before it that the fence stopped after the spawn had
	// committed: the run that waited then found the child by its key).
	spawner := func(owner string) []string {
		ids := []string{firstRun(t, runs[owner]).SpanID}
		for _, s := range fenced[owner] {
			ids = append(ids, s.SpanID)
		}
		return ids
	}
	require.Contains(t, spawner("turn"), traceparent(t, byKind["agent"].Trace).span)
	require.Contains(t, spawner("agent"), traceparent(t, byKind["tool"].Trace).span)
	tool := runs["tool"][len(runs["tool"])-1]
	require.Equal(t, "parent", tool.Attrs["process"])
	require.EqualValues(t, 1, tool.Attrs[string(otelarbor.AttrAttempt)])
	require.Equal(t, "completed", tool.Attrs[string(otelarbor.AttrOutcome)])

	// The waits are span events of the first runs, and only of them.
	for _, rs := range runs {
		for _, s := range rs {
			require.Equal(t, s.Attrs[string(otelarbor.AttrOutcome)] == "waiting", slices.Contains(s.Events, "arbor.wait"),
				"%s run %s: a wait event exactly when it waited", s.Name, s.SpanID)
		}
	}

	// Metrics of runner B: three tasks settled completed, one take-over,
	// one requeued task.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	require.EqualValues(t, 3, sumOf(t, rm, otelarbor.MetricTasksSettled, attribute.String(string(otelarbor.AttrStatus), "completed")))
	require.EqualValues(t, 1, sumOf(t, rm, otelarbor.MetricTakeOvers))
	require.EqualValues(t, 1, sumOf(t, rm, otelarbor.MetricRequeued))
	require.EqualValues(t, 3, histogramCount(t, rm, otelarbor.MetricRunDuration))
}

type parentRef struct{ trace, span string }

// traceparent parses a stored W3C traceparent: version-trace-span-flags.
func traceparent(t *testing.T, headers map[string]string) parentRef {
	t.Helper()
	parts := strings.Split(headers["traceparent"], "-")
	require.Len(t, parts, 4, "traceparent %q", headers["traceparent"])
	return parentRef{parts[1], parts[2]}
}

// firstRun is the run that spawned the task's child: the child's, whose
// outcome was a wait.
func firstRun(t *testing.T, rs []spanLine) spanLine {
	t.Helper()
	for _, s := range rs {
		if s.Attrs[string(otelarbor.AttrOutcome)] == "waiting" {
			require.Equal(t, "child", s.Attrs["process"])
			return s
		}
	}
	require.Fail(t, "no run that waited")
	return spanLine{}
}

func sumOf(t *testing.T, rm metricdata.ResourceMetrics, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is a sum", name)
			for _, dp := range sum.DataPoints {
				match := true
				for _, kv := range attrs {
					if v, ok := dp.Attributes.Value(kv.Key); !ok || v != kv.Value {
						match = false
					}
				}
				if match {
					total += dp.Value
				}
			}
		}
	}
	return total
}

func histogramCount(t *testing.T, rm metricdata.ResourceMetrics, name string) uint64 {
	t.Helper()
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				h, ok := m.Data.(metricdata.Histogram[float64])
				require.True(t, ok, "%s is a histogram", name)
				for _, dp := range h.DataPoints {
					n += dp.Count
				}
			}
		}
	}
	return n
}
