package fsm

import (
	"context"
	"errors"
	"fmt"
	"slices"

	lfsm "github.com/looplab/fsm"
)

// Status is a task's status. A task is live in [Pending], [Running],
// [Waiting], [Sleeping] and [Completing], and settled in the others.
type Status string

const (
	Pending    Status = "pending"
	Running    Status = "running"
	Waiting    Status = "waiting"
	Sleeping   Status = "sleeping"
	Completing Status = "completing"
	Completed  Status = "completed"
	Failed     Status = "failed"
	Aborted    Status = "aborted"
	Cancelled  Status = "cancelled"
	Orphaned   Status = "orphaned"
)

// Statuses lists every status, live ones first, in a stable order.
var Statuses = []Status{Pending, Running, Waiting, Sleeping, Completing, Completed, Failed, Aborted, Cancelled, Orphaned}

// Settled reports whether s is terminal. A settled task never changes again.
func (s Status) Settled() bool {
	switch s {
	case Completed, Failed, Aborted, Cancelled, Orphaned:
		return true
	}
	return false
}

// Live reports whether s is not settled.
func (s Status) Live() bool { return s.Valid() && !s.Settled() }

// Valid reports whether s is one of [Statuses].
func (s Status) Valid() bool { return slices.Contains(Statuses, s) }

// Event is what moves a task from one status to another.
type Event string

const (
	// Start is a start or a claim: pending → running.
	Start Event = "start"
	// Checkpoint saves phase and state (or extends the lease): running → running.
	Checkpoint Event = "checkpoint"
	// Wait parks a task on its children: running → waiting.
	Wait Event = "wait"
	// Sleep parks a task until a time: running → sleeping.
	Sleep Event = "sleep"
	// Retry parks a failed task until its backoff time: running → sleeping.
	Retry Event = "retry"
	// Hold completes a task whose foreground children are still live; its
	// result is held: running → completing.
	Hold Event = "hold"
	// Complete settles a task as completed: running or completing → completed.
	Complete Event = "complete"
	// Fail settles a task as failed: from running (no retry left), or from
	// pending (restart limit exceeded, handler kind unknown past its grace).
	Fail Event = "fail"
	// Cancel is a user's cancel, or abandon_on_restart at recovery.
	Cancel Event = "cancel"
	// Abort is an abort reaching a task that has run before.
	Abort Event = "abort"
	// Orphan is an abort reaching a pending task that never ran.
	Orphan Event = "orphan"
	// Recover puts a task whose holder died back to pending (attempt + 1).
	Recover Event = "recover"
	// Wake ends a wait or a sleep: waiting or sleeping → pending.
	Wake Event = "wake"
)

// Events lists every event in a stable order.
var Events = []Event{Start, Checkpoint, Wait, Sleep, Retry, Hold, Complete, Fail, Cancel, Abort, Orphan, Recover, Wake}

// table is DESIGN §2, the only definition of arbor's transitions.
var table = lfsm.Events{
	{Name: string(Start), Src: []string{string(Pending)}, Dst: string(Running)},
	{Name: string(Checkpoint), Src: []string{string(Running)}, Dst: string(Running)},
	{Name: string(Wait), Src: []string{string(Running)}, Dst: string(Waiting)},
	{Name: string(Sleep), Src: []string{string(Running)}, Dst: string(Sleeping)},
	{Name: string(Retry), Src: []string{string(Running)}, Dst: string(Sleeping)},
	{Name: string(Hold), Src: []string{string(Running)}, Dst: string(Completing)},
	{Name: string(Complete), Src: []string{string(Running), string(Completing)}, Dst: string(Completed)},
	{Name: string(Fail), Src: []string{string(Pending), string(Running)}, Dst: string(Failed)},
	{Name: string(Cancel), Src: []string{string(Pending), string(Running), string(Waiting), string(Sleeping)}, Dst: string(Cancelled)},
	{Name: string(Abort), Src: []string{string(Pending), string(Running), string(Waiting), string(Sleeping), string(Completing)}, Dst: string(Aborted)},
	{Name: string(Orphan), Src: []string{string(Pending)}, Dst: string(Orphaned)},
	{Name: string(Recover), Src: []string{string(Running)}, Dst: string(Pending)},
	{Name: string(Wake), Src: []string{string(Waiting), string(Sleeping)}, Dst: string(Pending)},
}

// ErrInvalidTransition is matched (with errors.Is) by every
// [*TransitionError].
var ErrInvalidTransition = errors.New("invalid transition")

// TransitionError says that Event is not allowed from From. TaskID is filled
// in by callers that know which task it was about (0 otherwise).
type TransitionError struct {
	TaskID int64
	From   Status
	Event  Event
}

func (e *TransitionError) Error() string {
	if e.TaskID != 0 {
		return fmt.Sprintf("task %d: invalid transition: %q is not allowed from %q", e.TaskID, e.Event, e.From)
	}
	return fmt.Sprintf("invalid transition: %q is not allowed from %q", e.Event, e.From)
}

// Is makes errors.Is(err, ErrInvalidTransition) true.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// Transition returns the status that event moves a task in from to, or a
// *TransitionError when the table has no such edge. It runs the looplab/fsm
// machine built from the table, so every status write in arbor is checked by
// the same definition.
func Transition(from Status, event Event) (Status, error) {
	if !from.Valid() || !slices.Contains(Events, event) {
		return "", &TransitionError{From: from, Event: event}
	}
	m := lfsm.NewFSM(string(from), table, nil)
	err := m.Event(context.Background(), string(event))
	var noTransition lfsm.NoTransitionError
	switch {
	case err == nil:
	case errors.As(err, &noTransition):
		// A self-loop (checkpoint): looplab reports it, the table allows it.
	default:
		return "", &TransitionError{From: from, Event: event}
	}
	return Status(m.Current()), nil
}

// Edge is one row of the transition table.
type Edge struct {
	From  Status
	Event Event
	To    Status
}

// Edges returns every (from, event, to) of the table, in table order.
func Edges() []Edge {
	var edges []Edge
	for _, desc := range table {
		for _, src := range desc.Src {
			edges = append(edges, Edge{From: Status(src), Event: Event(desc.Name), To: Status(desc.Dst)})
		}
	}
	return edges
}

// StatusChanges returns the distinct (from, to) pairs with from != to that
// the table allows, sorted; it is what the database trigger accepts.
func StatusChanges() [][2]Status {
	var pairs [][2]Status
	for _, e := range Edges() {
		p := [2]Status{e.From, e.To}
		if e.From != e.To && !slices.Contains(pairs, p) {
			pairs = append(pairs, p)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]Status) int {
		if c := slices.Index(Statuses, a[0]) - slices.Index(Statuses, b[0]); c != 0 {
			return c
		}
		return slices.Index(Statuses, a[1]) - slices.Index(Statuses, b[1])
	})
	return pairs
}
