package tasks

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/internal/core"
)

// ForkParams say what Fork copies.
type ForkParams struct {
	// ConversationID is the conversation to copy. Required.
	ConversationID string
	// ThroughTurn is the last turn (a settled root task of the
	// conversation) the copy holds. Required.
	ThroughTurn int64
	// NewConversationID is the copy's id; it must not exist. Default: a
	// fresh random id ("fork_" and 16 hex digits).
	NewConversationID string
}

// Forked is what Fork made.
type Forked struct {
	// ConversationID is the new conversation's id.
	ConversationID string
	// Tasks, Events and LogEntries count what was copied.
	Tasks, Events, LogEntries int64
}

// Fork copies a conversation's settled history, up to and including turn
// p.ThroughTurn, into a new conversation, so that a backend can "edit and
// regenerate": fork through the turn before the edited message, then
// create the new turn in the copy (docs/agents.md, "Fork: edit and
// regenerate").
//
// The copy holds every settled turn (root task) of the conversation up to
// ThroughTurn, each with its settled subtree — results, errors, phases,
// states, attempts and times as they were — the events addressed or
// delivered to those tasks, and the conversation's log up to the copied
// tasks' last entry. Ids in the copy are new (owners, waits and the
// events' ids remapped); each copied task records its source, and the
// database refuses a forked row that is not a faithful copy of a settled
// one. A live task (a background task still running, a turn still queued)
// is not history yet: it and everything under it stay out of the copy.
// The copy has nothing live and passes Check. The original is not written.
//
// It runs in one transaction that locks the source conversation first, so
// a turn created or settling concurrently is either wholly in the
// snapshot it copies or not at all. Bad input writes nothing: an unknown
// conversation or turn is arbortype.ErrNotFound, a turn of another conversation
// arbortype.ErrForeignTask, a task that is not a root arbortype.ErrNotRoot, a live turn
// arbortype.ErrNotSettled, a NewConversationID that exists arbortype.ErrConversationExists.
func (e *Engine) Fork(ctx context.Context, p ForkParams) (Forked, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (Forked, error) { return e.fork(ctx, tx, p) })
}

// ForkTx is Fork inside the caller's transaction.
func (e *Engine) ForkTx(ctx context.Context, tx pgx.Tx, p ForkParams) (Forked, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (Forked, error) { return e.fork(ctx, tx, p) })
}

func (e *Engine) fork(ctx context.Context, tx pgx.Tx, p ForkParams) (Forked, error) {
	r, err := e.core.Fork(ctx, tx, core.ForkParams(p))
	return Forked{ConversationID: r.ConversationID, Tasks: r.Tasks, Events: r.Events, LogEntries: r.LogEntries}, err
}
