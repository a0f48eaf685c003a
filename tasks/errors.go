package tasks

import (
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
)

// Sentinel errors of every arbor operation: this package's, and those of a
// handler's run (package machine). They are arbortype's, named here too so
// that errors.Is(err, tasks.ErrNotFound) reads naturally. Every error arbor
// returns wraps one of these, with the operation and the task or
// conversation in its text. The codes arbor records on a task it ends
// itself (restart limit, abandoned, unknown kind, panic) are arbortype's
// Code… constants.
var (
	// ErrNotFound: no task (or conversation) with that id.
	ErrNotFound = arbortype.ErrNotFound
	// ErrInvalidTransition: the state machine has no such edge (a cancel
	// of a settled task, say). Matched by every *TransitionError.
	ErrInvalidTransition = arbortype.ErrInvalidTransition
	// ErrInvalidArgument: a malformed argument (an empty kind, a text over
	// its limit, a negative limit, an invalid configuration…).
	ErrInvalidArgument = arbortype.ErrInvalidArgument
	// ErrInvalidJSON: a JSON document (input, state, result, error detail)
	// that does not parse, or that PostgreSQL's jsonb cannot store.
	ErrInvalidJSON = arbortype.ErrInvalidJSON
	// ErrPayloadTooLarge: a JSON document over Config.MaxPayloadBytes.
	ErrPayloadTooLarge = arbortype.ErrPayloadTooLarge
	// ErrOwnerNotLive: a child's owner is settled, completing or being
	// aborted, so it cannot take a new child.
	ErrOwnerNotLive = arbortype.ErrOwnerNotLive
	// ErrOwnerCompleting: the owner has completed and holds its result until
	// its children settle; it takes no new child. Matches ErrOwnerNotLive.
	ErrOwnerCompleting = arbortype.ErrOwnerCompleting
	// ErrOwnerAborting: the owner is being aborted; it takes no new child.
	// Matches ErrOwnerNotLive.
	ErrOwnerAborting = arbortype.ErrOwnerAborting
	// ErrForeignOwner: the owner belongs to another conversation.
	ErrForeignOwner = arbortype.ErrForeignOwner
	// ErrIdempotencyConflict: an idempotency key was reused for a task of a
	// different kind or owner.
	ErrIdempotencyConflict = arbortype.ErrIdempotencyConflict
	// ErrNotSleeping: WakeNow of a task that is not sleeping.
	ErrNotSleeping = arbortype.ErrNotSleeping
	// ErrSettled: Emit to a task that is settled.
	ErrSettled = arbortype.ErrSettled
	// ErrAwaitEnded: EmitToken with the token of an await that is over
	// (answered, timed out, woken, cancelled, aborted, its task settled or
	// awaiting again); nothing is emitted. A token accepted once returns
	// its emit instead, however often it is posted.
	ErrAwaitEnded = arbortype.ErrAwaitEnded
	// ErrBusy: a turn created with TurnReject while another turn of the
	// conversation is live; the error names it.
	ErrBusy = arbortype.ErrBusy
	// ErrNotSettled: Fork through a turn that is still live.
	ErrNotSettled = arbortype.ErrNotSettled
	// ErrNotRoot: Fork through a task that is not a turn (a root task).
	ErrNotRoot = arbortype.ErrNotRoot
	// ErrConversationExists: Fork into a conversation id that is taken.
	ErrConversationExists = arbortype.ErrConversationExists
	// ErrAlreadyRunning: another run started the task first.
	ErrAlreadyRunning = arbortype.ErrAlreadyRunning
	// ErrNotRunning: a write of a run (checkpoint, heartbeat, spawn,
	// complete, wait, sleep) to a task that is no longer running.
	ErrNotRunning = arbortype.ErrNotRunning
	// ErrLeaseLost: a write of a run whose task another run holds now, or
	// of a holder whose conversation lease was taken over.
	ErrLeaseLost = arbortype.ErrLeaseLost
	// ErrAborted: the task is aborted or being aborted; its run must stop.
	ErrAborted = arbortype.ErrAborted
	// ErrNotChild: a wait named a task that is not the waiter's own child.
	ErrNotChild = arbortype.ErrNotChild
	// ErrLeaseHeld: a conversation's lease is held by a live holder.
	ErrLeaseHeld = arbortype.ErrLeaseHeld
	// ErrForeignTask: a start under a conversation's lease, or a Fork,
	// named a task of another conversation.
	ErrForeignTask = arbortype.ErrForeignTask
	// ErrUnavailable: the database could not be reached, kept dropping
	// the connection, or kept cutting the operation's statements on its own
	// (a server-side timeout: statement_timeout, lock_timeout…), for longer
	// than Config.UnavailableTimeout; nothing was written. Transient faults
	// shorter than that are retried inside the operation and never reach
	// the caller.
	ErrUnavailable = arbortype.ErrUnavailable
	// ErrPermissionDenied: the database refused the role a statement ran
	// as.
	ErrPermissionDenied = arbortype.ErrPermissionDenied
	// ErrDatabase: the database refused the operation for a reason arbor
	// does not map to one of these errors; its error is in the chain.
	ErrDatabase = arbortype.ErrDatabase
	// ErrAmbiguous: the connection was lost while COMMIT was in flight; the
	// operation may or may not have been applied. Read the task to find out.
	ErrAmbiguous = arbortype.ErrAmbiguous
)

// TransitionError is the typed form of ErrInvalidTransition: it names the
// task, the status it was in and the event that was refused.
type TransitionError = fsm.TransitionError
