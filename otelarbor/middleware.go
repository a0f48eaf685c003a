// Package otelarbor is arbor's OpenTelemetry support, in a Go module of its
// own so that arbor itself does not depend on OpenTelemetry (as River's
// otelriver is for River).
//
// One [Middleware] does three jobs, each through an interface of arbor's:
//
//   - as tasks.Config.TraceInjector, it stores the trace context of the
//     context a task is created in with the task (W3C traceparent and
//     tracestate): the span of your HTTP handler for a turn, the run's span
//     for a handler's spawns;
//   - as a machine.RunnerConfig.Middleware, it makes one span per run of a
//     task, named by the task's kind, whose parent is the context stored
//     with the task — so a tree of tasks is one trace, across processes and
//     across recovery — with the task's attributes, the run's outcome, and
//     span events for waits, sleeps, awaits, events delivered and aborts;
//   - as a machine.RunnerConfig.Observer, it records metrics: tasks settled
//     by status, run duration, time from created to first started, wake
//     lateness, lease take-overs.
//
// To start, make one with [NewMiddleware] and give it to the engine
// (tasks.Config.TraceInjector) and to each runner (RunnerConfig.Middleware
// and Observer), as otelarbor/example_middleware_test.go does.
// docs/observability.md describes the spans, attributes and metrics.
package otelarbor

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// ScopeName is the instrumentation scope of otelarbor's tracer and meter.
const ScopeName = "github.com/arborhq/arbor/otelarbor"

// Attribute keys of otelarbor's spans and metrics.
const (
	AttrConversationID = attribute.Key("arbor.conversation_id")
	AttrTaskID         = attribute.Key("arbor.task.id")
	AttrTaskKind       = attribute.Key("arbor.task.kind")
	AttrOwnerID        = attribute.Key("arbor.task.owner_id")
	AttrAttempt        = attribute.Key("arbor.task.attempt")
	AttrRetries        = attribute.Key("arbor.task.retries")
	AttrPhase          = attribute.Key("arbor.task.phase")
	AttrOutcome        = attribute.Key("arbor.run.outcome")
	AttrStatus         = attribute.Key("arbor.task.status")
	AttrEventName      = attribute.Key("arbor.event.name")
	AttrTimedOut       = attribute.Key("arbor.event.timed_out")
	AttrWoken          = attribute.Key("arbor.run.woken")
	AttrReason         = attribute.Key("arbor.reason")
	AttrWokenBy        = attribute.Key("arbor.wake.by")
)

// Config configures a Middleware. The zero value of every field means its
// default.
type Config struct {
	// TracerProvider makes the spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes a task's trace context at create and reads it at
	// every run. Default: propagation.TraceContext{} (W3C traceparent and
	// tracestate). Every process that creates or runs tasks of a schema
	// must use the same one.
	Propagator propagation.TextMapPropagator
}

// Middleware is arbor's OpenTelemetry support. Set it, the same value, as
// tasks.Config.TraceInjector, in machine.RunnerConfig.Middleware and as
// machine.RunnerConfig.Observer. It is safe for concurrent use.
type Middleware struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	metrics    metrics
}

var (
	_ arbortype.TraceInjector = (*Middleware)(nil)
	_ machine.Middleware      = (*Middleware)(nil)
	_ machine.Observer        = (*Middleware)(nil)
)

// NewMiddleware returns a Middleware; cfg may be nil. It fails only when
// the meter provider refuses an instrument.
func NewMiddleware(cfg *Config) (*Middleware, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	m, err := newMetrics(c.MeterProvider.Meter(ScopeName))
	if err != nil {
		return nil, fmt.Errorf("otelarbor.NewMiddleware: %w", err)
	}
	return &Middleware{tracer: c.TracerProvider.Tracer(ScopeName), propagator: c.Propagator, metrics: m}, nil
}

// InjectTrace returns the trace context of ctx as propagation headers, for
// the engine to store with the task being created (arbortype.TraceInjector).
// A context without a span — a create outside any trace — gets a span of
// its own, "arbor.create", ended at once: the root of the new tree's trace,
// so that every run of the tree is in one trace even then.
func (m *Middleware) InjectTrace(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		var span trace.Span
		ctx, span = m.tracer.Start(ctx, "arbor.create", trace.WithSpanKind(trace.SpanKindProducer))
		span.End()
	}
	carrier := propagation.MapCarrier{}
	m.propagator.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}

// Run makes the span of one run (machine.Middleware): named by the task's
// kind, a child of the trace context stored with the task, with the task's
// attributes; the run's outcome is set on it when the run ends, with a
// span event for a wait, a sleep, an await or an abort, and one at the
// start for the event that woke an await.
func (m *Middleware) Run(ctx context.Context, run *machine.Run, next func(context.Context) machine.Outcome) {
	t := &run.Task
	if len(t.Trace) > 0 {
		ctx = m.propagator.Extract(ctx, propagation.MapCarrier(t.Trace))
	}
	ctx, span := m.tracer.Start(ctx, t.Kind, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		AttrConversationID.String(t.ConversationID),
		AttrTaskID.Int64(t.ID),
		AttrTaskKind.String(t.Kind),
		AttrOwnerID.Int64(t.OwnerID),
		AttrAttempt.Int(t.Attempt),
		AttrRetries.Int(t.Retries),
		AttrPhase.String(t.Phase),
	))
	defer span.End()
	if d := t.Delivered; d != nil {
		span.AddEvent("arbor.event_delivered", trace.WithAttributes(AttrEventName.String(d.Name), AttrTimedOut.Bool(d.TimedOut)))
	}
	out := next(ctx)
	span.SetAttributes(AttrOutcome.String(out.Kind.String()))
	switch out.Kind {
	case machine.OutcomeWaiting:
		span.AddEvent("arbor.wait", trace.WithAttributes(AttrWoken.Bool(out.Woken)))
	case machine.OutcomeSleeping:
		span.AddEvent("arbor.sleep")
	case machine.OutcomeAwaiting:
		span.AddEvent("arbor.await", trace.WithAttributes(AttrWoken.Bool(out.Woken)))
	case machine.OutcomeFailed:
		if out.Err != nil {
			span.RecordError(out.Err)
			span.SetStatus(codes.Error, out.Err.Error())
		} else {
			span.SetStatus(codes.Error, "failed")
		}
	case machine.OutcomeNone:
		if aborted(out.Err) {
			span.AddEvent("arbor.abort", trace.WithAttributes(AttrReason.String(out.Err.Error())))
		} else if out.Err != nil {
			span.SetAttributes(AttrReason.String(out.Err.Error()))
		}
	}
}

// aborted says whether a run ended because its task was taken from it: an
// abort (or cancel) made elsewhere, or a refused write that found it so.
func aborted(err error) bool {
	return errors.Is(err, arbortype.ErrAborted) || errors.Is(err, machine.ErrTaskStopped)
}

// settledStatus is the status a run's outcome settled its task in, and
// whether it settled it.
func settledStatus(t *arbortype.Task, out machine.Outcome) (arbortype.Status, bool) {
	switch out.Kind {
	case machine.OutcomeCompleted:
		return arbortype.StatusCompleted, true
	case machine.OutcomeFailed:
		// The engine retries a failure while retries are left, unless it is
		// non-retryable (the runner's own failures carry no handler error).
		if out.Err != nil && !errors.Is(out.Err, arbortype.ErrNonRetryable) && t.Retries < t.MaxRetries {
			return "", false
		}
		return arbortype.StatusFailed, true
	case machine.OutcomeNone:
		if errors.Is(out.Err, arbortype.ErrAborted) {
			return arbortype.StatusAborted, true
		}
	}
	return "", false
}
