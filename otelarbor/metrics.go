package otelarbor

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/arborhq/arbor/machine"
)

// Metric names (docs/observability.md).
const (
	MetricTasksSettled = "arbor.tasks.settled"
	MetricRunDuration  = "arbor.run.duration"
	MetricRuns         = "arbor.runs"
	MetricStartDelay   = "arbor.task.start_delay"
	MetricWakeLateness = "arbor.wake.lateness"
	MetricTakeOvers    = "arbor.lease.takeovers"
	MetricRequeued     = "arbor.tasks.requeued"
)

type metrics struct {
	settled    metric.Int64Counter
	runs       metric.Int64Counter
	duration   metric.Float64Histogram
	startDelay metric.Float64Histogram
	lateness   metric.Float64Histogram
	takeOvers  metric.Int64Counter
	requeued   metric.Int64Counter
}

func newMetrics(meter metric.Meter) (metrics, error) {
	var m metrics
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	m.settled, err = meter.Int64Counter(MetricTasksSettled, metric.WithUnit("{task}"),
		metric.WithDescription("Tasks settled by their runs, by kind and status (completed, failed, aborted)"))
	add(err)
	m.runs, err = meter.Int64Counter(MetricRuns, metric.WithUnit("{run}"),
		metric.WithDescription("Runs ended, by kind and outcome"))
	add(err)
	m.duration, err = meter.Float64Histogram(MetricRunDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a run: the handler and the run's ending write, by kind and outcome"))
	add(err)
	m.startDelay, err = meter.Float64Histogram(MetricStartDelay, metric.WithUnit("s"),
		metric.WithDescription("Time from a task's creation to its first start, by the database's clock, by kind"))
	add(err)
	m.lateness, err = meter.Float64Histogram(MetricWakeLateness, metric.WithUnit("s"),
		metric.WithDescription("How long after its time a sleep or an await's timeout was woken, by what woke it (timer, river)"))
	add(err)
	m.takeOvers, err = meter.Int64Counter(MetricTakeOvers, metric.WithUnit("{conversation}"),
		metric.WithDescription("Conversations taken over from a holder whose lease expired, with something to recover"))
	add(err)
	m.requeued, err = meter.Int64Counter(MetricRequeued, metric.WithUnit("{task}"),
		metric.WithDescription("Running tasks a take-over requeued to run again (attempt + 1)"))
	add(err)
	return m, errors.Join(errs...)
}

// Observe records the metrics of what a runner reports (machine.Observer).
func (m *Middleware) Observe(o machine.Observation) {
	ctx := context.Background()
	switch o.Kind {
	case machine.ObservedRunEnded:
		t := o.Task
		kind := AttrTaskKind.String(t.Kind)
		outcome := metric.WithAttributes(kind, AttrOutcome.String(o.Outcome.Kind.String()))
		m.metrics.runs.Add(ctx, 1, outcome)
		m.metrics.duration.Record(ctx, o.Ended.Sub(o.Started).Seconds(), outcome)
		if status, ok := settledStatus(t, o.Outcome); ok {
			m.metrics.settled.Add(ctx, 1, metric.WithAttributes(kind, AttrStatus.String(string(status))))
		}
		// A first start stamps started_at and updated_at with the same
		// now(): only then is started_at this run's start.
		if t.StartedAt != nil && t.StartedAt.Equal(t.UpdatedAt) {
			m.metrics.startDelay.Record(ctx, t.StartedAt.Sub(t.CreatedAt).Seconds(), metric.WithAttributes(kind))
		}
	case machine.ObservedTakeOver:
		m.metrics.takeOvers.Add(ctx, 1)
		if n := len(o.Report.Requeued); n > 0 {
			m.metrics.requeued.Add(ctx, int64(n))
		}
	case machine.ObservedWake:
		m.metrics.lateness.Record(ctx, o.Wake.Late.Seconds(), metric.WithAttributes(AttrWokenBy.String(string(o.Wake.By))))
	}
}
