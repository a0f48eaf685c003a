package arbortype

import "context"

// TraceInjector gives a new task the trace context it is created in: the
// engine calls InjectTrace with the context passed to the create (a
// handler's spawn passes its own, which its run's middleware derived from
// the task's trace) and stores what it returns with the task
// (Task.Trace), unchanged for the task's life. A runner's middleware
// restores it on every run, so that a tree of tasks is one trace across
// processes and recoveries.
//
// arbor imports no tracing library: an implementation (otelarbor's
// Middleware for OpenTelemetry) turns the context's span into propagation
// headers. InjectTrace is called once per create (once for a whole
// CreateMany or SpawnMany), outside the create's transaction, so it is not
// repeated when the transaction is retried; it must be safe for concurrent
// use. It returns nil when there is nothing to store; what it returns must
// encode as at most 4 KiB of JSON, with no empty key, or the create is
// refused with ErrInvalidArgument.
type TraceInjector interface {
	InjectTrace(ctx context.Context) map[string]string
}
