package fsm

import (
	"context"
	"errors"
	"fmt"
	"slices"

	lfsm "github.com/looplab/fsm"

	"github.com/arborhq/arbor/arbortype"
)

// Event is what moves a task from one status to another: a name of the
// transition table, as a state machine's literature and looplab/fsm call
// it, and as TransitionError and the generated guard (docs/state-machine.md)
// report it. It is not an event in the sense of the rest of arbor's API
// (arbortype.Event, what Emit sends and AwaitEvent waits for): nothing is
// sent or stored. The name stays because this package is the state
// machine, where "event" is the word every reader of a transition table
// expects.
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
	// Await parks a task until an event of a name is emitted to it (or to its
	// conversation), or until its timeout: running → sleeping.
	Await Event = "await"
	// Hold completes a task whose foreground children are still live; its
	// result is held: running → completing.
	Hold Event = "hold"
	// Complete settles a task as completed: running or completing → completed.
	Complete Event = "complete"
	// Fail settles a task as failed: from running (no retry left), or from
	// pending (restart limit exceeded, handler kind unknown past its grace).
	Fail Event = "fail"
	// Expire fails a live task past its deadline, whatever it is doing.
	Expire Event = "expire"
	// Cancel is a user's cancel, or abandon_on_restart at recovery.
	Cancel Event = "cancel"
	// Abort is an abort reaching a task that has run before.
	Abort Event = "abort"
	// Orphan is an abort reaching a pending task that never ran.
	Orphan Event = "orphan"
	// Recover puts a task whose holder died back to pending (attempt + 1).
	Recover Event = "recover"
	// Wake ends a wait, a sleep or an await (the event delivered, or its
	// timeout): waiting or sleeping → pending.
	Wake Event = "wake"
	// Rerun puts the rerun of a task a waiting task waits on in its place in
	// the wait (docs/design.md §3.17): waiting → waiting.
	Rerun Event = "rerun"
)

// Events lists every event in a stable order.
var Events = []Event{Start, Checkpoint, Wait, Sleep, Retry, Await, Hold, Complete, Fail, Expire, Cancel, Abort, Orphan, Recover, Wake, Rerun}

// table is docs/design.md §2, the only definition of arbor's transitions.
var table = lfsm.Events{
	{Name: string(Start), Src: []string{string(arbortype.StatusPending)}, Dst: string(arbortype.StatusRunning)},
	{Name: string(Checkpoint), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusRunning)},
	{Name: string(Wait), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusWaiting)},
	{Name: string(Sleep), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusSleeping)},
	{Name: string(Retry), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusSleeping)},
	{Name: string(Await), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusSleeping)},
	{Name: string(Hold), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusCompleting)},
	{Name: string(Complete), Src: []string{string(arbortype.StatusRunning), string(arbortype.StatusCompleting)}, Dst: string(arbortype.StatusCompleted)},
	{Name: string(Fail), Src: []string{string(arbortype.StatusPending), string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusFailed)},
	{Name: string(Expire), Src: []string{string(arbortype.StatusPending), string(arbortype.StatusRunning), string(arbortype.StatusWaiting), string(arbortype.StatusSleeping), string(arbortype.StatusCompleting)}, Dst: string(arbortype.StatusFailed)},
	{Name: string(Cancel), Src: []string{string(arbortype.StatusPending), string(arbortype.StatusRunning), string(arbortype.StatusWaiting), string(arbortype.StatusSleeping)}, Dst: string(arbortype.StatusCancelled)},
	{Name: string(Abort), Src: []string{string(arbortype.StatusPending), string(arbortype.StatusRunning), string(arbortype.StatusWaiting), string(arbortype.StatusSleeping), string(arbortype.StatusCompleting)}, Dst: string(arbortype.StatusAborted)},
	{Name: string(Orphan), Src: []string{string(arbortype.StatusPending)}, Dst: string(arbortype.StatusOrphaned)},
	{Name: string(Recover), Src: []string{string(arbortype.StatusRunning)}, Dst: string(arbortype.StatusPending)},
	{Name: string(Wake), Src: []string{string(arbortype.StatusWaiting), string(arbortype.StatusSleeping)}, Dst: string(arbortype.StatusPending)},
	{Name: string(Rerun), Src: []string{string(arbortype.StatusWaiting)}, Dst: string(arbortype.StatusWaiting)},
}

// TransitionError says that Event is not allowed from From. TaskID is filled
// in by callers that know which task it was about (0 otherwise).
type TransitionError struct {
	TaskID int64
	From   arbortype.Status
	Event  Event
}

func (e *TransitionError) Error() string {
	if e.TaskID != 0 {
		return fmt.Sprintf("task %d: invalid transition: %q is not allowed from %q", e.TaskID, e.Event, e.From)
	}
	return fmt.Sprintf("invalid transition: %q is not allowed from %q", e.Event, e.From)
}

// Is makes errors.Is(err, arbortype.ErrInvalidTransition) true.
func (e *TransitionError) Is(target error) bool { return target == arbortype.ErrInvalidTransition }

// Transition returns the status that event moves a task in from to, or a
// *TransitionError when the table has no such edge. It runs the looplab/fsm
// machine built from the table, so every status write in arbor is checked by
// the same definition.
func Transition(from arbortype.Status, event Event) (arbortype.Status, error) {
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
	return arbortype.Status(m.Current()), nil
}

// Edge is one row of the transition table.
type Edge struct {
	From  arbortype.Status
	Event Event
	To    arbortype.Status
}

// Edges returns every (from, event, to) of the table, in table order.
func Edges() []Edge {
	var edges []Edge
	for _, desc := range table {
		for _, src := range desc.Src {
			edges = append(edges, Edge{From: arbortype.Status(src), Event: Event(desc.Name), To: arbortype.Status(desc.Dst)})
		}
	}
	return edges
}

// StatusChanges returns the distinct (from, to) pairs with from != to that
// the table allows, sorted; it is what the database trigger accepts.
func StatusChanges() [][2]arbortype.Status {
	var pairs [][2]arbortype.Status
	for _, e := range Edges() {
		p := [2]arbortype.Status{e.From, e.To}
		if e.From != e.To && !slices.Contains(pairs, p) {
			pairs = append(pairs, p)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]arbortype.Status) int {
		if c := slices.Index(arbortype.Statuses, a[0]) - slices.Index(arbortype.Statuses, b[0]); c != 0 {
			return c
		}
		return slices.Index(arbortype.Statuses, a[1]) - slices.Index(arbortype.Statuses, b[1])
	})
	return pairs
}
