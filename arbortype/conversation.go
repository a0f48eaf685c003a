package arbortype

import "time"

// Conversation is one conversation: the unit of ownership, recovery and
// fencing. At most one holder (a runner's node, or a caller's lease) runs
// its tasks at a time.
type Conversation struct {
	ID string
	// Holder names who holds the conversation's lease; "" when nobody does.
	Holder string
	// Epoch grows with every take-over of the lease; every run is fenced
	// by it.
	Epoch int64
	// LeaseExpiresAt is the holder's lease deadline, by the database's
	// clock; nil when nobody holds it.
	LeaseExpiresAt *time.Time
	CreatedAt      time.Time
	// Tenant is the tenant the conversation belongs to ("" the default
	// tenant), set when it was created and never changed.
	Tenant string
}

// ConversationSummary is a conversation with live work, as a listing shows
// it: the conversation and how many live tasks it has in each status.
type ConversationSummary struct {
	Conversation
	// Live counts the conversation's live tasks by status; statuses with
	// none are absent.
	Live map[Status]int
	// Awaiting is how many of its sleeping tasks are parked in an await (an
	// approval, a message): counted in Live[StatusSleeping] too.
	Awaiting int
}
