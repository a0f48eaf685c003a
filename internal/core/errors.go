package core

import (
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
)

// The engine's errors wrap arbortype's sentinels (arbortype/errors.go),
// named as arbortype.ErrNotFound and the rest here as everywhere, or are a
// *TransitionError, which matches arbortype.ErrInvalidTransition; each
// with the task id and the operation in its text.

// TransitionError is the typed form of ErrInvalidTransition: it names the
// task, the status it was in and the event that was refused.
type TransitionError = fsm.TransitionError

func transitionError(taskID int64, from arbortype.Status, event fsm.Event) error {
	return &TransitionError{TaskID: taskID, From: from, Event: event}
}
