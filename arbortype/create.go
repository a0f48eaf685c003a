package arbortype

import (
	"encoding/json"
	"time"
)

// RestartLimitNone is the CreateParams.RestartLimit of a task that fails
// with restart_limit_exceeded at its first recovery. (arbortype.RestartLimitNone
// is the same constant.)
const RestartLimitNone = -1

// CreateParams describe a new task: the argument of tasks.Engine's Create,
// CreateTx, CreateMany and CreateManyTx (package tasks names it
// arbortype.CreateParams). ConversationID and Kind are required; the zero value
// of every other field is its default. It is defined here, once, because
// the engine takes it as it is: a new create option is one field here.
type CreateParams struct {
	// ConversationID groups tasks; its row is created on first use. Required,
	// at most 200 bytes of UTF-8 text.
	ConversationID string
	// OwnerID is the task creating this one; 0 creates a root task (a turn).
	// The owner must be live, in the same conversation, not completing and
	// not being aborted. (A handler creates its children with
	// machine.Run.Spawn, which also fences the create by its run.)
	OwnerID int64
	// Kind names the handler that runs the task. Required, at most 200 bytes.
	Kind string
	// Input is the task's JSON input; empty for none.
	Input json.RawMessage
	// Background makes a child that neither holds its owner in completing
	// nor is reached by its owner's abort. Only for children.
	Background bool
	// AbandonOnRestart makes a task that is never re-run after a crash (a
	// non-idempotent call): on recovery it is settled cancelled instead.
	AbandonOnRestart bool
	// RestartLimit is how many recoveries the task survives; 0 means
	// tasks.Config.RestartLimit, RestartLimitNone means none.
	RestartLimit int
	// MaxRetries is how many times a failed run is retried (a handler's
	// error not marked machine.NonRetryable). 0 means no retry.
	MaxRetries int
	// RetryBackoffBase and RetryBackoffCap are the task's backoff between
	// retries (see tasks.Config.RetryBackoffBase); 0 means the engine's.
	// They are stored with the task, so every node retries it alike.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// IdempotencyKey, unique per conversation, makes a repeated Create
	// return the task the first one created (created=false). At most 200
	// bytes; empty for none; keys starting with "arbor:" are arbor's own.
	IdempotencyKey string
	// Deadline, when not zero, is when the task, if still live, fails with
	// code CodeDeadlineExceeded and its foreground subtree is aborted
	// (enforced by the runners, within a PollInterval).
	Deadline time.Time
	// OnBusy says what happens when this root task (a turn) is created while
	// another root of the conversation is live: TurnQueue (it waits its
	// turn), TurnInterrupt, TurnReject or TurnSteer (see TurnPolicy), each
	// whatever tasks.Config.TurnPolicies says for the kind. The zero value,
	// TurnDefault, is tasks.Config.TurnPolicies[Kind], and TurnQueue for a
	// kind with no entry. Only for roots (a child's may be TurnDefault or
	// TurnQueue, which mean nothing for it).
	OnBusy TurnPolicy
	// SteerEvent names the event a steered input is emitted as (OnBusy
	// TurnSteer): what the live turn awaits to take it. Default
	// tasks.SteerEventDefault ("message").
	SteerEvent string
	// Budgets are set on the new task: its subtree's spend is counted and
	// bounded by them (see tasks.Engine.SetBudget). At most 64, each
	// counter once (else ErrInvalidArgument, nothing written).
	Budgets []BudgetLimit
	// ConversationBudgets are set on the conversation for each counter it
	// has no budget of yet: a session budget every turn's create may pass.
	// At most 64, each counter once, as Budgets.
	ConversationBudgets []BudgetLimit
	// Tenant is the tenant of the conversation: set by the create that makes
	// the conversation, and never changed (a fork carries it). "" is the
	// default tenant; for an existing conversation, "" means its tenant,
	// and another tenant than its own is refused (ErrInvalidArgument). At
	// most 200 bytes. The claim shares the runners among tenants, weighted
	// (tasks.Engine.SetTenantWeight; docs/agents.md, "Many tenants").
	Tenant string
	// Priority orders the task among its tenant's runnable work, from -3600
	// to 3600; 0 means tasks.Config.KindPriorities[Kind]. A task of
	// priority p is queued as if created p seconds earlier: an interactive
	// turn of priority 60 goes before a background backlog up to a minute
	// old, and a task is never passed by one created more than the
	// difference of their priorities, in seconds, after it (aging).
	Priority int
	// ConcurrencyKey names a key of the task for a concurrency limit (a
	// tool, a model provider): the limit "key:<ConcurrencyKey>"
	// (tasks.Engine.SetConcurrencyLimit) bounds how many such tasks run at
	// once across every node. At most 200 bytes; "" for none.
	ConcurrencyKey string
	// QueueTTL is how long the task may wait to start: a task (a turn
	// queued behind a live one, say) that has not started QueueTTL after its
	// create is cancelled with code CodeExpired and never starts (the
	// runners' maintenance cancels it within a PollInterval; no claim starts
	// it past its time). 0 means no limit.
	QueueTTL time.Duration
}
