package tasks

import (
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/core"
)

// Sentinel errors of every arbor operation: this package's, and those of a
// handler's run (package machine). Test for them with errors.Is; every error
// arbor returns wraps one of these, with the operation and the task or
// conversation in its text.
var (
	// ErrNotFound: no task (or conversation) with that id.
	ErrNotFound = core.ErrNotFound
	// ErrInvalidTransition: the state machine has no such edge (a cancel
	// of a settled task, say). Matched by every *TransitionError.
	ErrInvalidTransition = core.ErrInvalidTransition
	// ErrInvalidArgument: a malformed argument (an empty kind, a text over
	// its limit, a negative limit, an invalid configuration…).
	ErrInvalidArgument = core.ErrInvalidArgument
	// ErrInvalidJSON: a JSON document (input, state, result, error detail)
	// that does not parse, or that PostgreSQL's jsonb cannot store.
	ErrInvalidJSON = core.ErrInvalidJSON
	// ErrPayloadTooLarge: a JSON document over Config.MaxPayloadBytes.
	ErrPayloadTooLarge = core.ErrPayloadTooLarge
	// ErrOwnerNotLive: a child's owner is settled, completing or being
	// aborted, so it cannot take a new child.
	ErrOwnerNotLive = core.ErrOwnerNotLive
	// ErrOwnerCompleting: the owner has completed and holds its result until
	// its children settle; it takes no new child. Matches ErrOwnerNotLive.
	ErrOwnerCompleting = core.ErrOwnerCompleting
	// ErrOwnerAborting: the owner is being aborted; it takes no new child.
	// Matches ErrOwnerNotLive.
	ErrOwnerAborting = core.ErrOwnerAborting
	// ErrForeignOwner: the owner belongs to another conversation.
	ErrForeignOwner = core.ErrForeignOwner
	// ErrIdempotencyConflict: an idempotency key was reused for a task of a
	// different kind or owner.
	ErrIdempotencyConflict = core.ErrIdempotencyConflict
	// ErrNotSleeping: WakeNow of a task that is not sleeping.
	ErrNotSleeping = core.ErrNotSleeping
	// ErrAlreadyRunning: another run started the task first.
	ErrAlreadyRunning = core.ErrAlreadyRunning
	// ErrNotRunning: a write of a run (checkpoint, heartbeat, spawn,
	// complete, wait, sleep) to a task that is no longer running.
	ErrNotRunning = core.ErrNotRunning
	// ErrLeaseLost: a write of a run whose task another run holds now, or
	// of a holder whose conversation lease was taken over.
	ErrLeaseLost = core.ErrLeaseLost
	// ErrAborted: the task is aborted or being aborted; its run must stop.
	ErrAborted = core.ErrAborted
	// ErrNotChild: a wait named a task that is not the waiter's own child.
	ErrNotChild = core.ErrNotChild
	// ErrLeaseHeld: a conversation's lease is held by a live holder.
	ErrLeaseHeld = core.ErrLeaseHeld
	// ErrForeignTask: a start under a conversation's lease named a task of
	// another conversation.
	ErrForeignTask = core.ErrForeignTask
	// ErrAmbiguous: the connection was lost while COMMIT was in flight; the
	// operation may or may not have been applied. Read the task to find out.
	ErrAmbiguous = core.ErrAmbiguous
)

// TransitionError is the typed form of ErrInvalidTransition: it names the
// task, the status it was in and the event that was refused.
type TransitionError = fsm.TransitionError

// Codes arbor records in arbortype.TaskError.Code when it, not a handler,
// ends a task.
const (
	// CodeRestartLimitExceeded: recovered more often than its restart limit.
	CodeRestartLimitExceeded = core.CodeRestartLimitExceeded
	// CodeAbandonedOnRestart: an abandon_on_restart task found running at
	// recovery, settled cancelled instead of run again.
	CodeAbandonedOnRestart = core.CodeAbandonedOnRestart
	// CodeUnknownKind: no runner had a handler for its kind within the
	// runners' UnknownKindGrace.
	CodeUnknownKind = core.CodeUnknownKind
	// CodePanic: its handler panicked (the stack is in the error's detail).
	CodePanic = core.CodePanic
)
