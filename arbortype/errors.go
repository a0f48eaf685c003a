package arbortype

import (
	"errors"
	"fmt"
)

// Sentinel errors of every arbor operation. Test for them with errors.Is;
// every error of package tasks, of a handler's machine.Run and of
// machine.Lease wraps one of these, with the operation and the task or
// conversation in its text. They are spelled here only (package
// migrations adds ErrVersionMismatch; package machine names the causes of
// a handler context's cancellation).
var (
	// ErrNotFound: no task (or conversation) with that id.
	ErrNotFound = errors.New("not found")
	// ErrInvalidTransition: the state machine has no such edge. Matched by
	// every *fsm.TransitionError.
	ErrInvalidTransition = errors.New("invalid transition")
	// ErrInvalidArgument: a malformed argument (an empty kind, a text over
	// its limit, a negative limit…).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidJSON: a JSON document (input, state, result, error detail)
	// that does not parse, or that PostgreSQL's jsonb cannot store.
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrPayloadTooLarge: a JSON document over Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrOwnerNotLive: a child's owner is settled, completing or being
	// aborted, so it cannot take a new child.
	ErrOwnerNotLive = errors.New("owner is not live")
	// ErrOwnerCompleting: the owner has completed and holds its result until
	// its children settle; it takes no new child. Matches ErrOwnerNotLive.
	ErrOwnerCompleting = fmt.Errorf("%w: owner is completing", ErrOwnerNotLive)
	// ErrOwnerAborting: the owner is being aborted; it takes no new child.
	// Matches ErrOwnerNotLive.
	ErrOwnerAborting = fmt.Errorf("%w: owner is being aborted", ErrOwnerNotLive)
	// ErrForeignOwner: the owner belongs to another conversation.
	ErrForeignOwner = errors.New("owner belongs to another conversation")
	// ErrIdempotencyConflict: an idempotency key was reused for a task of a
	// different kind or owner.
	ErrIdempotencyConflict = errors.New("idempotency key already used for a different task")
	// ErrAlreadyRunning: another runner started the task first.
	ErrAlreadyRunning = errors.New("task is already running")
	// ErrNotRunning: a fenced write (checkpoint, heartbeat, complete, fail,
	// wait) to a task that is not running.
	ErrNotRunning = errors.New("task is not running")
	// ErrLeaseLost: a fenced write with a token that is no longer the task's
	// current one: another run holds it now.
	ErrLeaseLost = errors.New("lease lost")
	// ErrAborted: the task is aborted or being aborted; its runner must stop.
	ErrAborted = errors.New("task aborted")
	// ErrNotChild: a wait named a task that is not the waiter's own child.
	ErrNotChild = errors.New("not a child of the task")
	// ErrLeaseHeld: the conversation's lease is held by a live holder (or
	// being taken by another transaction right now).
	ErrLeaseHeld = errors.New("conversation lease is held")
	// ErrForeignTask: a start named a task of another conversation than the
	// lease's.
	ErrForeignTask = errors.New("task belongs to another conversation")
	// ErrNotSleeping: a wake of a task that is not sleeping.
	ErrNotSleeping = errors.New("task is not sleeping")
	// ErrSettled: an event emitted to a task that is settled.
	ErrSettled = errors.New("task is settled")
	// ErrAwaitEnded: an await's token posted after that await ended (its
	// event came, it timed out, its task was woken, cancelled, aborted or
	// settled, or awaited again): a token answers its own await only, and
	// nothing is emitted. A token that was accepted once is not refused:
	// posting it again returns that emit.
	ErrAwaitEnded = errors.New("the await this token belongs to is over")
	// ErrConcurrencyLimit: a start (machine.Lease's Start) of a task one of
	// whose concurrency limits has no free slot; the task stays pending.
	ErrConcurrencyLimit = errors.New("concurrency limit reached")
	// ErrBusy: a turn created with the reject policy while another turn of
	// the conversation is live.
	ErrBusy = errors.New("a turn of the conversation is live")
	// ErrNotSettled: a fork through a turn that is still live (only
	// settled history is copied).
	ErrNotSettled = errors.New("task is not settled")
	// ErrNotRoot: a fork through a task that is not a turn (a root task).
	ErrNotRoot = errors.New("task is not a root task")
	// ErrConversationExists: a fork into a conversation id that is taken.
	ErrConversationExists = errors.New("conversation already exists")
	// ErrUnavailable: the database could not be reached, or kept dropping
	// the connection, for longer than the engine's retry budget
	// (tasks.Config.UnavailableTimeout). Nothing was written: every attempt
	// failed before it could commit. Retry later.
	ErrUnavailable = errors.New("database unavailable")
	// ErrPermissionDenied: the database refused the role a statement ran as
	// (a migration by a role that does not own the schema, a runtime role
	// without a grant).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrDatabase: the database refused an operation for a reason arbor does
	// not map to one of its own errors (a bug, or the schema changed behind
	// arbor's back). The database's error is in the chain.
	ErrDatabase = errors.New("database error")
	// ErrAmbiguous: the connection was lost while COMMIT was in flight; the
	// operation may or may not have been applied. Read the task to find out.
	ErrAmbiguous = errors.New("outcome unknown: connection lost during commit")
)

// ErrNonRetryable marks a handler's error as final: the task fails at once,
// whatever retries it has left (see machine.NonRetryable).
var ErrNonRetryable = errors.New("non-retryable")

// Codes arbor records in TaskError.Code when it, not a handler, ends a task.
const (
	// CodeRestartLimitExceeded: recovered more often than its restart limit.
	CodeRestartLimitExceeded = "restart_limit_exceeded"
	// CodeAbandonedOnRestart: an abandon_on_restart task found running at
	// recovery, settled cancelled instead of run again.
	CodeAbandonedOnRestart = "abandoned_on_restart"
	// CodeUnknownKind: no runner had a handler for its kind within the
	// runners' UnknownKindGrace.
	CodeUnknownKind = "unknown_kind"
	// CodePanic: its handler panicked (the stack is in the error's detail).
	CodePanic = "panic"
	// CodeAborted: aborted with a reason (tasks.WithReason); the reason is
	// the error's message.
	CodeAborted = "aborted"
	// CodeDeadlineExceeded: still live at its deadline (CreateParams and
	// SpawnParams Deadline); its foreground subtree was aborted.
	CodeDeadlineExceeded = "deadline_exceeded"
	// CodeEndingNotCommitted: its handler ended the run with a Tx form
	// (Run.CompleteTx, SpawnTx) whose transaction never committed.
	CodeEndingNotCommitted = "ending_not_committed"
	// CodeSteered: the turn of a steered message (TurnSteer), cancelled
	// because the live turn it was steered into took the message at an
	// await; its result names that turn and the event.
	CodeSteered = "steered"
	// CodeExpired: a turn created with a QueueTTL that had not started when
	// it passed; cancelled, it never starts.
	CodeExpired = "expired"
)
