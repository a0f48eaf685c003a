package arbortype

import (
	"encoding/json"
	"time"
)

// Event is an event emitted to a conversation or to one of its tasks.
type Event struct {
	ID             int64
	ConversationID string
	// TaskID is the task it is addressed to; 0: the conversation.
	TaskID int64
	Name   string
	// Payload is the event's JSON; nil for none.
	Payload json.RawMessage
	// Queued: every emit of the name is a delivery of its own, in order.
	// Otherwise the first emit of the name at its address won.
	Queued         bool
	IdempotencyKey string
	EmittedAt      time.Time
	// DeliveredTo is the task the event woke; 0 while it waits for an await.
	DeliveredTo int64
	DeliveredAt *time.Time
}

// PendingEvent is an await a conversation's task is parked in: what the
// conversation waits for from outside (an approval deep in a sub-agent is
// one).
type PendingEvent struct {
	// TaskID, Kind and OwnerID are the awaiting task's.
	TaskID  int64
	Kind    string
	OwnerID int64
	// Name is the event awaited.
	Name string
	// Token answers exactly this await, while it lasts
	// (tasks.Engine.EmitToken); once the await is over it is refused
	// (ErrAwaitEnded), never kept for a later await of the name.
	Token string
	// Timeout is when the await ends without an event; nil for never.
	Timeout *time.Time
}

// LogKind is what a conversation log entry records: the column kind of
// the table conversation_log, whose CHECK constraint allows exactly
// LogKinds. Its values are the strings the log has always held ("status",
// "progress", "event"), so that JSON and the database read the same.
type LogKind string

const (
	// LogKindStatus is a task's status change, written by the tasks
	// table's triggers for every insert and every change of status.
	LogKindStatus LogKind = "status"
	// LogKindProgress is a handler's published progress (Run.Progress).
	LogKindProgress LogKind = "progress"
	// LogKindEvent is an event emitted to the conversation.
	LogKindEvent LogKind = "event"
)

// LogKinds are every kind the log holds.
var LogKinds = []LogKind{LogKindStatus, LogKindProgress, LogKindEvent}

// LogEntry is one entry of a conversation's log, in commit order.
type LogEntry struct {
	// Seq orders the entries; a follower resumes after the last it saw.
	Seq            int64
	ConversationID string
	// TaskID is the task the entry is about (0: none).
	TaskID int64
	// Kind is LogKindStatus (a task's status changed: Status, and Name its
	// kind), LogKindProgress (a handler published Payload, Name its label)
	// or LogKindEvent (an event named Name was emitted; Payload has its id
	// and payload). A status entry's Payload has, when they apply, "owner"
	// (the owner's id), "error" and "message" (a settle's error code and
	// message: an abort's reason is its message, see SettleError) and
	// "await" (the event an await waits for).
	Kind    LogKind
	Status  Status
	Name    string
	Payload json.RawMessage
	At      time.Time
}

// Terminal reports whether the entry is a task settling.
func (e LogEntry) Terminal() bool { return e.Kind == LogKindStatus && e.Status.Settled() }

// SettleError is the error a settle's entry records — its code and
// message, as the task's Error has them (an abort WithReason: code
// CodeAborted, the reason as message) — or nil for an entry of another
// kind, a settle without an error, or an entry written before the log
// carried messages (its code only, then).
func (e LogEntry) SettleError() *TaskError {
	if !e.Terminal() || len(e.Payload) == 0 {
		return nil
	}
	var p struct {
		Code    string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(e.Payload, &p) != nil || (p.Code == "" && p.Message == "") {
		return nil
	}
	return &TaskError{Code: p.Code, Message: p.Message}
}

// TurnPolicy says what creating a turn (a root task) does when another root
// task of the conversation is live — the message that arrives mid-turn.
type TurnPolicy string

const (
	// TurnDefault, the zero value, is the policy configured for the turn's
	// kind (tasks.Config.TurnPolicies), and TurnQueue for a kind with none.
	// As a configured policy (an entry of TurnPolicies) it queues.
	TurnDefault TurnPolicy = ""
	// TurnQueue: the new turn waits; it starts when the live one settles.
	// Given as CreateParams.OnBusy it queues whatever the kind's configured
	// policy is.
	TurnQueue TurnPolicy = "queue"
	// TurnInterrupt: the live turns are aborted (their subtrees, leaves
	// first, with the reason "interrupted by a new turn") and the new turn
	// created, in one transaction.
	TurnInterrupt TurnPolicy = "interrupt"
	// TurnReject: nothing is written; the create fails with ErrBusy naming
	// the live turn.
	TurnReject TurnPolicy = "reject"
	// TurnSteer: the input is emitted to the live turn as a queued event
	// (named CreateParams.SteerEvent, default "message"), and Create returns
	// the live turn with created false. The message is never lost: it is
	// also made a turn of its own, queued behind the live one as TurnQueue
	// would, which answers it if the live turn settles without taking it,
	// and which is cancelled (code CodeSteered) in the transaction where
	// the live turn's await takes it.
	TurnSteer TurnPolicy = "steer"
)

// Valid reports whether p is one of the policies.
func (p TurnPolicy) Valid() bool {
	switch p {
	case TurnDefault, TurnQueue, TurnInterrupt, TurnReject, TurnSteer:
		return true
	}
	return false
}
