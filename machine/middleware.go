package machine

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/reconcile"
)

// Hooks for tracing and metrics. arbor imports no telemetry library: a
// runner calls a Middleware around each run and tells an Observer what
// happens, and a module of its own (otelarbor, for OpenTelemetry) turns
// them into spans and metrics. Without them (the default), a run costs
// nothing more.

// Middleware wraps every run a Runner starts (RunnerConfig.Middleware).
//
// Run is called on the run's worker goroutine, with the run's context and
// the run (its Task: kind, id, conversation, attempt, retries, trace
// context). It must call next exactly once, with ctx or a context derived
// from it (a span's): next runs the handler — and, when the handler returned
// without ending its run, the runner's complete or fail — and returns how
// the run ended. A spawn made by the handler with the context next passed it
// takes its trace context from it (tasks.Config.TraceInjector). The
// context's cancellation and its cause (ErrTaskStopped, ErrShutdown, a lost
// lease) must be kept.
type Middleware interface {
	Run(ctx context.Context, run *Run, next func(context.Context) Outcome)
}

// OutcomeKind says how a run ended.
type OutcomeKind uint8

const (
	// OutcomeNone: the run ended with no ending write of its own — its task
	// was taken from it (aborted, cancelled, recovered by another holder),
	// its write was refused, or the runner stopped first (then the release,
	// or the next holder, recovers the task). Outcome.Err says why.
	OutcomeNone OutcomeKind = iota
	// OutcomeCompleted: the run completed its task (completed, or completing
	// until its foreground children settle). A CompleteTx counts once the
	// handler returned (the runner fails a run whose transaction did not
	// commit, and the outcome is then OutcomeFailed).
	OutcomeCompleted
	// OutcomeFailed: the handler's error (Outcome.Err) was recorded: the
	// task failed, or is retried after its backoff when it has retries left
	// and the error is not NonRetryable.
	OutcomeFailed
	// OutcomeWaiting: the run parked its task on its children (Wait).
	OutcomeWaiting
	// OutcomeSleeping: the run parked its task until a time (SleepUntil).
	OutcomeSleeping
	// OutcomeAwaiting: the run parked its task on an event (AwaitEvent).
	OutcomeAwaiting
)

var outcomeNames = [...]string{"none", "completed", "failed", "waiting", "sleeping", "awaiting"}

// String returns the outcome's name: "none", "completed", "failed",
// "waiting", "sleeping" or "awaiting".
func (k OutcomeKind) String() string {
	if int(k) < len(outcomeNames) {
		return outcomeNames[k]
	}
	return "unknown"
}

// Outcome is how a run ended, as a Middleware's next returns it and an
// Observer's ObservedRunEnded carries it.
type Outcome struct {
	Kind OutcomeKind
	// Err is the handler's error for OutcomeFailed; for OutcomeNone, why the
	// run ended without an ending write (arbortype.ErrAborted,
	// arbortype.ErrLeaseLost, arbortype.ErrNotRunning, or the context's cause:
	// ErrTaskStopped, ErrShutdown, ErrBlocked); nil otherwise.
	Err error
	// Woken: a Wait or an AwaitEvent found satisfied at once, the task
	// already runnable again.
	Woken bool
}

// Observer receives what a Runner does, for metrics
// (RunnerConfig.Observer). Observe is called synchronously from the
// runner's goroutines (workers, the producer, the waker's timers), often at
// once: it must be safe for concurrent use, and return quickly.
type Observer interface {
	Observe(Observation)
}

// ObservationKind says what an Observation reports.
type ObservationKind uint8

const (
	// ObservedRunEnded: a run ended (Task, Outcome, Started, Ended).
	ObservedRunEnded ObservationKind = iota + 1
	// ObservedTakeOver: the runner opened a conversation and recovered what
	// its former holder left (Report: tasks requeued, abandoned, woken or
	// completed). Opening a conversation with nothing to recover is not a
	// take-over and is not reported.
	ObservedTakeOver
	// ObservedWake: a sleep or an await's timeout ended (Wake; Late is how
	// long after its time the wake committed).
	ObservedWake
)

// Observation is one thing a Runner reports to its Observer: a run's end,
// a take-over or a wake. It is not an event in arbor's sense (what Emit
// sends and AwaitEvent waits for, arbortype.Event): nothing is stored or
// delivered. Only the fields its Kind names are set.
type Observation struct {
	Kind ObservationKind
	// Task is the run's task, as it was claimed (ObservedRunEnded). Read
	// it, do not keep it.
	Task *arbortype.Task
	// Outcome is how the run ended (ObservedRunEnded).
	Outcome Outcome
	// Started and Ended are when the runner started the run's handler and
	// when the run ended, by this process's clock (ObservedRunEnded).
	Started, Ended time.Time
	// Report is what a take-over recovered (ObservedTakeOver).
	Report reconcile.Report
	// Wake is the wake (ObservedWake).
	Wake Wake
}

// outcomeOf is the run's outcome after its ending write o landed.
func outcomeOf(o core.Outcome, res core.OutcomeResult) Outcome {
	out := Outcome{Woken: res.Woken}
	switch o.Kind {
	case core.OutComplete:
		out.Kind = OutcomeCompleted
	case core.OutFail:
		out.Kind = OutcomeFailed
	case core.OutWait:
		out.Kind = OutcomeWaiting
	case core.OutSleep:
		out.Kind = OutcomeSleeping
	case core.OutAwait:
		out.Kind = OutcomeAwaiting
	}
	return out
}

// Outcome reports how the run ended: in a Middleware, what next returned.
// Before the run ended it is the zero Outcome.
func (r *Run) Outcome() Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcome
}

// record keeps the outcome of the run's ending write o.
func (r *Run) record(o core.Outcome, res core.OutcomeResult, handlerErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res.Err != nil {
		r.outcome = Outcome{Kind: OutcomeNone, Err: res.Err}
		return
	}
	r.outcome = outcomeOf(o, res)
	if o.Kind == core.OutFail {
		r.outcome.Err = handlerErr
	}
}

// noteStop says why a run that ended without an ending write of its own
// did: the cause of its context's cancellation, or the handler's error
// (arbortype.ErrAborted from a refused write, say).
func (r *Run) noteStop(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.outcome.Kind == OutcomeNone && r.outcome.Err == nil {
		r.outcome.Err = context.Cause(ctx)
		if r.outcome.Err == nil {
			r.outcome.Err = r.handlerErr
		}
	}
}
