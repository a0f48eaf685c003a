package otelarbor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/otelarbor"
	"github.com/arborhq/arbor/tasks"
)

// One Middleware, wired three times: as the engine's trace injector (every
// task stores the trace context it was created in), as the runner's
// middleware (a span per run, named by kind, a child of that context) and
// as its observer (metrics). Here the spans go to an in-memory exporter;
// in production, give Config an OTLP exporter's TracerProvider (or leave
// it nil for the global one).
func ExampleMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("ARBOR_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	const schema = "otelarbor_example"
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		log.Fatal(err)
	}
	defer func() {
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			log.Print(err)
		}
	}()
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}

	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	mw, err := otelarbor.NewMiddleware(&otelarbor.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TraceInjector: mw})
	if err != nil {
		log.Fatal(err)
	}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "answer" {
				return run.Complete(ctx, json.RawMessage(`"It is sunny."`))
			}
			// ctx carries the run's span: the child's trace context is it.
			tool, err := run.Spawn(ctx, machine.SpawnParams{Kind: "weather"})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled, Phase: "answer"})
		},
		"weather": func(ctx context.Context, run *machine.Run) error {
			return run.Complete(ctx, json.RawMessage(`{"sky": "clear"}`))
		},
	}
	runner, err := machine.NewRunner(engine, handlers, &machine.RunnerConfig{
		Middleware: []machine.Middleware{mw},
		Observer:   mw,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// Your request handler's span: the turn's trace is its trace.
	reqCtx, req := tp.Tracer("chat-api").Start(ctx, "POST /messages")
	turn, _, err := engine.Create(reqCtx, arbortype.CreateParams{ConversationID: "otel-example", Kind: "turn"})
	if err != nil {
		log.Fatal(err)
	}
	req.End()
	if _, err := engine.AwaitSettled(ctx, turn.ID); err != nil {
		log.Fatal(err)
	}
	if err := runner.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	spans := exporter.GetSpans()
	var lines []string
	for _, s := range spans {
		parent := "(root)"
		for _, p := range spans {
			if p.SpanContext.SpanID() == s.Parent.SpanID() {
				parent = p.Name
			}
		}
		var outcome string
		for _, kv := range s.Attributes {
			if kv.Key == otelarbor.AttrOutcome {
				outcome = " " + kv.Value.AsString()
			}
		}
		sameTrace := s.SpanContext.TraceID() == req.SpanContext().TraceID()
		lines = append(lines, fmt.Sprintf("%s%s, child of %s, same trace: %t", s.Name, outcome, parent, sameTrace))
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// POST /messages, child of (root), same trace: true
	// turn completed, child of POST /messages, same trace: true
	// turn waiting, child of POST /messages, same trace: true
	// weather completed, child of turn, same trace: true
}
