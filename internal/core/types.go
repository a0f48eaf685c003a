package core

import "github.com/arborhq/arbor/arbortype"

// Short names for the row types, inside the engine.
type (
	Task       = arbortype.Task
	TaskError  = arbortype.TaskError
	WaitPolicy = arbortype.WaitPolicy
)

const (
	AllSettled = arbortype.AllSettled
	FailFast   = arbortype.FailFast
)
