package arbortype

import (
	"encoding/json"
	"time"
)

// Task is one task: a row of arbor's tasks table, as it was when read.
type Task struct {
	// ID is the task's id. Ids grow: an owner's id is always smaller than
	// its children's, so ascending id order is ancestors first.
	ID int64
	// ConversationID is the conversation the task belongs to; it never
	// changes, and owner and child always share it.
	ConversationID string
	// OwnerID is the task that created this one; 0 for a root task.
	OwnerID int64
	// Kind names the handler that runs the task.
	Kind string
	// Status is where the task is in its life (see [Status]).
	Status Status
	// Background is set on a child that neither holds its owner in
	// completing nor is reached by its owner's abort.
	Background bool
	// Input is the JSON the task was created with; nil for none.
	Input json.RawMessage
	// Phase and State are the task's checkpoint, replaced as a whole by each
	// checkpoint (and by a wait or a sleep). A handler resumes from them.
	Phase string
	State json.RawMessage
	// Result is the JSON a completed (or completing, or cancelled) task
	// recorded; nil for none.
	Result json.RawMessage
	// Error is the recorded error of a failed task (or the last failure of
	// a task being retried, or why recovery settled it); nil for none.
	Error *TaskError
	// Attempt counts the recoveries of the task after its holder died
	// (from 0). Resuming after a wait or a sleep does not count.
	Attempt int
	// RestartLimit is how many recoveries the task survives; the next one
	// fails it with code "restart_limit_exceeded".
	RestartLimit int
	// AbandonOnRestart marks a task that is never run twice: recovery
	// settles it cancelled (code "abandoned_on_restart") instead.
	AbandonOnRestart bool
	// AbortRequested is set on every task an abort reaches; such a task is
	// never started again and takes no new child.
	AbortRequested bool
	// WaitPolicy and WaitIDs are the task's last wait on its children: kept
	// after it woke, so that the resumed handler can read their outcomes.
	WaitPolicy WaitPolicy
	WaitIDs    []int64
	// WakeAt is the time of the task's current (or last) sleep; nil if it
	// never slept.
	WakeAt *time.Time
	// SleepSeq numbers the task's sleeps (and retries' backoffs) from 1.
	SleepSeq int64
	// MaxRetries is how many times a failed run is retried; Retries how
	// many times it was.
	MaxRetries int
	Retries    int
	// RetryBackoffBase and RetryBackoffCap are the task's backoff between
	// retries: retry n (from 0) waits min(cap, base·2ⁿ), jittered into its
	// upper half.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// ErrorHistory holds the task's failed runs, oldest first; the engine
	// keeps the newest few (its ErrorHistoryLimit).
	ErrorHistory []FailedTry
	// WakeJobID is the River job that wakes the task from its current (or
	// last) sleep; 0 if it never slept.
	WakeJobID int64
	// Token is the fencing token of the current run of a running task: every
	// write of that run names it, and a write with any other token is
	// refused. 0 when the task is not running.
	Token int64
	// Epoch is the conversation lease epoch the current run started under;
	// 0 when the task is not running.
	Epoch int64
	// LeaseExpiresAt is the current run's task lease deadline, by the
	// database's clock; nil when the task is not running.
	LeaseExpiresAt *time.Time
	// IdempotencyKey is the key the task was created with; "" for none.
	IdempotencyKey string
	// SettleSeq orders the settles of a conversation's tasks (children
	// before their owners); 0 while the task is live.
	SettleSeq int64
	CreatedAt time.Time
	UpdatedAt time.Time
	// StartedAt is when the task first ran; nil if it never did.
	StartedAt *time.Time
	// SettledAt is when the task settled; nil while it is live.
	SettledAt *time.Time
	// AwaitName is the event the task's current (or last) await waits for;
	// "" if it never awaited, or slept since.
	AwaitName string
	// AwaitToken is the token of the task's current (or last) await; it
	// answers that await while it lasts (tasks.Engine.EmitToken), and is
	// refused with ErrAwaitEnded once it is over. "" if the task never
	// awaited, or slept since.
	AwaitToken string
	// Delivered is what woke the task's last await: the event, or its
	// timeout; nil before it woke, and once the task parks again.
	Delivered *Delivered
	// Deadline is when the task, still live, fails with code
	// "deadline_exceeded" (its foreground subtree aborted); nil for none.
	Deadline *time.Time
	// Trace is the trace context the task was created in, as propagation
	// headers (with otelarbor, W3C "traceparent" and "tracestate"): set
	// at create by the engine's trace injector (tasks.Config.TraceInjector)
	// from the creating context — a handler's spawn inherits its run's —
	// and never changed after. A runner's middleware restores it on every
	// run. Nil when there was none.
	Trace map[string]string
	// Tenant is the tenant of the task's conversation ("" the default
	// tenant); it never changes.
	Tenant string
	// Priority orders the task among its tenant's runnable work: a task of
	// priority p is queued as if created p seconds earlier (the aging:
	// low priority is late, never starved).
	Priority int
	// ConcurrencyKey is the key the task named for a concurrency limit
	// ("" none): the limit "key:<ConcurrencyKey>" bounds its runs.
	ConcurrencyKey string
	// QueueExpiresAt is when the task, never started by then, is cancelled
	// with code CodeExpired instead of starting; nil for none.
	QueueExpiresAt *time.Time
	// RerunOf is the task this one runs again (tasks.Engine.Rerun), from
	// that task's last checkpoint; 0 for none.
	RerunOf int64
}

// Delivered is what ended an await: an event emitted to the task or its
// conversation, or the await's timeout.
type Delivered struct {
	// Name is the event's name (the await's).
	Name string `json:"name"`
	// EventID, Payload and EmittedAt are the event's; zero on a timeout.
	EventID   int64           `json:"event_id,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	EmittedAt *time.Time      `json:"emitted_at,omitempty"`
	// TimedOut says the await's timeout came first.
	TimedOut bool `json:"timed_out,omitempty"`
}

// TaskError is the recorded error of a failed (or retried) task.
type TaskError struct {
	// Code is a short machine-readable cause set by arbor, such as
	// "restart_limit_exceeded", "abandoned_on_restart", "unknown_kind" or
	// "panic"; empty for an error the handler returned.
	Code string `json:"code,omitempty"`
	// Message is the error's text, truncated to the engine's limit.
	Message string `json:"message"`
	// Detail is optional JSON attached to the error (a panic's stack).
	Detail json.RawMessage `json:"detail,omitempty"`
	// NonRetryable makes a failure final even when the task has retries
	// left.
	NonRetryable bool `json:"non_retryable,omitempty"`
}

// FailedTry is one entry of a task's error history: a run that failed.
type FailedTry struct {
	// Try is the run that failed, from 1: the task's retries + 1 then.
	Try int `json:"try"`
	// At is when the failure was recorded, by the database's clock.
	At           time.Time `json:"at"`
	Code         string    `json:"code,omitempty"`
	Message      string    `json:"message"`
	NonRetryable bool      `json:"non_retryable,omitempty"`
}
