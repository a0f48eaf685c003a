// Package workhook is the bridge between package arbortest and package
// machine: arbortest runs one handler on one task the way a Runner runs it,
// which takes machine's unexported pieces (a Run with a sink of the
// completer's transactions, the runner's rules for ending a run its handler
// left open, the panic guard), and none of them belongs on machine's public
// API, which is for handlers and for code that runs tasks itself.
//
// Package machine sets Work when it is initialised. arbortest imports
// machine (its signatures name machine.Handler), so Work is set whenever
// arbortest can be called. Nothing else may use this package.
package workhook

import (
	"context"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// Report is what one run of a handler did, as package machine saw it.
type Report struct {
	// Started is the task as it was started for the run.
	Started arbortype.Task
	// HandlerErr is what the handler returned (a panic as an error).
	HandlerErr error
	// Ending is the kind of the write that ended the run (complete, fail,
	// wait, sleep, await): the handler's, or the one written for it. Ended
	// is false when no ending write landed: the task was taken from the run
	// (aborted, cancelled) before it ended.
	Ending core.OutcomeKind
	Ended  bool
	// Woken: the run's wait or await was satisfied when it was written, and
	// the task woke at once.
	Woken bool
	// EndErr is the refusal of the ending write, if it was refused.
	EndErr error
}

// Work takes the lease of taskID's conversation, starts the task, calls
// handler (a machine.Handler) once on its run, ends the run as a Runner
// would, releases the lease and reports what happened. An error is arbor's
// refusal to run the task (not found, not pending, the conversation held
// elsewhere) or the database's; the handler's own error is in the Report.
var Work func(ctx context.Context, engine *tasks.Engine, taskID int64, handler any) (Report, error)
