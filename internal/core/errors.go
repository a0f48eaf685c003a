package core

import (
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
)

// Sentinel errors. Test for them with errors.Is; every error the engine
// returns wraps one of these (or is a *TransitionError, which matches
// ErrInvalidTransition), with the task id and the operation in its text.
// The sentinels are arbortype's (see arbortype/errors.go).
var (
	ErrNotFound            = arbortype.ErrNotFound
	ErrInvalidTransition   = arbortype.ErrInvalidTransition
	ErrInvalidArgument     = arbortype.ErrInvalidArgument
	ErrInvalidJSON         = arbortype.ErrInvalidJSON
	ErrPayloadTooLarge     = arbortype.ErrPayloadTooLarge
	ErrOwnerNotLive        = arbortype.ErrOwnerNotLive
	ErrOwnerCompleting     = arbortype.ErrOwnerCompleting
	ErrOwnerAborting       = arbortype.ErrOwnerAborting
	ErrForeignOwner        = arbortype.ErrForeignOwner
	ErrIdempotencyConflict = arbortype.ErrIdempotencyConflict
	ErrAlreadyRunning      = arbortype.ErrAlreadyRunning
	ErrNotRunning          = arbortype.ErrNotRunning
	ErrLeaseLost           = arbortype.ErrLeaseLost
	ErrAborted             = arbortype.ErrAborted
	ErrNotChild            = arbortype.ErrNotChild
	ErrLeaseHeld           = arbortype.ErrLeaseHeld
	ErrForeignTask         = arbortype.ErrForeignTask
	ErrNotSleeping         = arbortype.ErrNotSleeping
	ErrSettled             = arbortype.ErrSettled
	ErrAwaitEnded          = arbortype.ErrAwaitEnded
	ErrBusy                = arbortype.ErrBusy
	ErrNotSettled          = arbortype.ErrNotSettled
	ErrNotRoot             = arbortype.ErrNotRoot
	ErrConversationExists  = arbortype.ErrConversationExists
	ErrUnavailable         = arbortype.ErrUnavailable
	ErrDatabase            = arbortype.ErrDatabase
	ErrAmbiguous           = arbortype.ErrAmbiguous
)

// TransitionError is the typed form of ErrInvalidTransition: it names the
// task, the status it was in and the event that was refused.
type TransitionError = fsm.TransitionError

func transitionError(taskID int64, from arbortype.Status, event fsm.Event) error {
	return &TransitionError{TaskID: taskID, From: from, Event: event}
}
