package arbortype

import "slices"

// Status is a task's status. A task is live in [StatusPending],
// [StatusRunning], [StatusWaiting], [StatusSleeping] and [StatusCompleting],
// and settled in the others. A settled task never changes again. The
// transitions between statuses are the table of package fsm
// (docs/state-machine.md).
type Status string

const (
	// StatusPending: created, woken, or put back by recovery; waiting to run.
	StatusPending Status = "pending"
	// StatusRunning: a run of its handler holds it, fenced by a token.
	StatusRunning Status = "running"
	// StatusWaiting: parked on its children (all_settled or fail_fast).
	StatusWaiting Status = "waiting"
	// StatusSleeping: parked until a time (a sleep, or a retry's backoff).
	StatusSleeping Status = "sleeping"
	// StatusCompleting: completed while foreground children were live; it
	// holds its result and completes when the last of them settles.
	StatusCompleting Status = "completing"
	// StatusCompleted: settled with a result.
	StatusCompleted Status = "completed"
	// StatusFailed: settled with an error, no retry left.
	StatusFailed Status = "failed"
	// StatusAborted: settled by an abort after it had run.
	StatusAborted Status = "aborted"
	// StatusCancelled: settled by a user's cancel, or abandoned on restart.
	StatusCancelled Status = "cancelled"
	// StatusOrphaned: settled by an abort before any code of it ran.
	StatusOrphaned Status = "orphaned"
)

// Statuses lists every status, live ones first, in a stable order.
var Statuses = []Status{StatusPending, StatusRunning, StatusWaiting, StatusSleeping, StatusCompleting,
	StatusCompleted, StatusFailed, StatusAborted, StatusCancelled, StatusOrphaned}

// LiveStatuses lists the live statuses in the order of [Statuses].
var LiveStatuses = []Status{StatusPending, StatusRunning, StatusWaiting, StatusSleeping, StatusCompleting}

// Settled reports whether s is terminal.
func (s Status) Settled() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusAborted, StatusCancelled, StatusOrphaned:
		return true
	}
	return false
}

// Live reports whether s is a valid status that is not settled.
func (s Status) Live() bool { return s.Valid() && !s.Settled() }

// Valid reports whether s is one of [Statuses].
func (s Status) Valid() bool { return slices.Contains(Statuses, s) }

// WaitPolicy says when a task waiting on its children wakes.
type WaitPolicy string

const (
	// AllSettled wakes the waiting task when every waited child is
	// settled, whatever its outcome.
	AllSettled WaitPolicy = "all_settled"
	// FailFast wakes the waiting task at the first waited child that
	// settles other than completed, and aborts the other live waited
	// children (each subtree leaves first) in that same transaction. The
	// waiting task is not failed for it: it resumes and decides.
	FailFast WaitPolicy = "fail_fast"
)

// Valid reports whether p is [AllSettled] or [FailFast].
func (p WaitPolicy) Valid() bool { return p == AllSettled || p == FailFast }
