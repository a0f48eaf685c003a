package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// EmitParams describe an event (see Engine.Emit).
type EmitParams struct {
	// ConversationID is the conversation the event is for. Required.
	ConversationID string
	// TaskID addresses the event to one live task of the conversation; 0
	// addresses the conversation: the oldest task awaiting the name takes
	// it, or the next one to await it.
	TaskID int64
	// Name is the event's name, what an await waits for. Required, at most
	// 200 bytes.
	Name string
	// Payload is the event's JSON (at most 64 KiB); empty for none.
	Payload json.RawMessage
	// Queue makes every emit of the name a delivery of its own, taken by
	// the awaits in order (messages, steering). Without it the first emit
	// of the name at its address wins and later emits return it
	// (created false): a decision, set once. Use one policy per name.
	Queue bool
	// IdempotencyKey makes a repeated emit return the first (created
	// false). At most 200 bytes; keys starting with "arbor:" are arbor's.
	IdempotencyKey string
}

// Emit emits an event, in a transaction of its own, and delivers it to the
// task awaiting it if one is parked (waking it in the same transaction);
// otherwise it waits for the next await of its name. No event is lost
// whatever the order of the emit and the await: both hold the
// conversation's row. created is false for a repeat (the key, or a
// first-wins name already emitted); nothing is written then. An unknown
// conversation or task is arbortype.ErrNotFound, a task of another conversation
// arbortype.ErrForeignTask, a settled one arbortype.ErrSettled; a payload over 64 KiB
// arbortype.ErrPayloadTooLarge.
//
// When a machine.Runner of this process holds the conversation and has a
// worker free, the emit's transaction also starts the task it woke, and
// the runner enters its handler once the emit has committed
// (docs/design.md §3.18).
func (e *Engine) Emit(ctx context.Context, p EmitParams) (ev arbortype.Event, created bool, err error) {
	r, err := e.emitting(ctx, func(tx pgx.Tx) (core.Emitted, error) { return e.emit(ctx, tx, p) })
	return r.Event.Arbor(), r.Created, err
}

// emitting runs an emit's transaction, fn, in which a delivery that woke a
// task is followed by the claim of a runner of this process that holds
// the conversation, when one grants it (docs/design.md §3.18, "A wake by
// an event"); the runner dispatches what it claimed after the commit. A
// claim the database refuses is dropped and the emit made again without
// it: an event is never refused for its claim.
func (e *Engine) emitting(ctx context.Context, fn func(tx pgx.Tx) (core.Emitted, error)) (core.Emitted, error) {
	var (
		g        core.ClaimGrant
		asked    bool
		claimed  []core.Task
		xact     int64
		claimErr error
	)
	r, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (core.Emitted, error) {
		claimed, xact, claimErr = nil, 0, nil
		out, err := fn(tx)
		if err != nil || out.Delivered == 0 {
			return out, err
		}
		if !asked {
			// Asked once, after the first delivery: the grant (its workers,
			// the claim lock read-held) lasts to the Done below.
			asked = true
			g = e.core.GrantIn(out.Event.ConversationID)
		}
		if g == nil {
			return out, nil
		}
		claimed, xact, claimErr = e.core.ClaimFor(ctx, tx, g.Params())
		return out, claimErr
	})
	if g == nil {
		return r, err
	}
	if claimErr != nil {
		g.Done(nil, 0, claimErr)
		return core.Tx(ctx, e.core, fn)
	}
	g.Done(claimed, xact, err)
	return r, err
}

// EmitTx is Emit inside the caller's transaction (the user's message row
// and its delivery to the turn commit together).
func (e *Engine) EmitTx(ctx context.Context, tx pgx.Tx, p EmitParams) (ev arbortype.Event, created bool, err error) {
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (core.Emitted, error) { return e.emit(ctx, tx, p) })
	return r.Event.Arbor(), r.Created, err
}

func (e *Engine) emit(ctx context.Context, tx pgx.Tx, p EmitParams) (core.Emitted, error) {
	if strings.HasPrefix(p.Name, "arbor:") {
		return core.Emitted{}, fmt.Errorf("emit: event name %q: the prefix \"arbor:\" is arbor's own (%s is emitted by a budget's raise): %w",
			p.Name, arbortype.BudgetEvent, arbortype.ErrInvalidArgument)
	}
	if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
		return core.Emitted{}, fmt.Errorf("emit: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w", p.IdempotencyKey, arbortype.ErrInvalidArgument)
	}
	return e.core.Emit(ctx, tx, core.EmitParams(p))
}

// EmitToken answers the await whose token is token (PendingEvent.Token, a
// parked task's AwaitToken) with payload: an event of the await's name
// addressed to its task and delivered to that await in the same
// transaction, emitted once however often the token is posted (a client's
// retry, a double click: created false, the first emit returned, also after
// the task has moved on).
//
// A token answers its own await and nothing else. Posted after that await
// is over — its event came, it timed out, the task was woken, cancelled,
// aborted or settled, or it awaited again — and never accepted before, it
// is arbortype.ErrAwaitEnded and nothing is written: unlike an Emit by name, which
// waits for the next await of its name, a late answer is never kept for a
// later await. A token racing its await's timeout is either the await's
// answer or refused. An unknown token is arbortype.ErrNotFound; a payload over 64
// KiB arbortype.ErrPayloadTooLarge. The token of a budget's park (an await of
// arbortype.BudgetEvent, listed by PendingEvents) is ErrInvalidArgument:
// only a raise of the budget (SetBudget) ends that await.
//
// As Emit does, it starts the task it woke when a runner of this process
// holds the conversation.
func (e *Engine) EmitToken(ctx context.Context, token string, payload json.RawMessage) (ev arbortype.Event, created bool, err error) {
	r, err := e.emitting(ctx, func(tx pgx.Tx) (core.Emitted, error) { return e.core.EmitToken(ctx, tx, token, payload) })
	return r.Event.Arbor(), r.Created, err
}

// EmitTokenTx is EmitToken inside the caller's transaction.
func (e *Engine) EmitTokenTx(ctx context.Context, tx pgx.Tx, token string, payload json.RawMessage) (ev arbortype.Event, created bool, err error) {
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (core.Emitted, error) { return e.core.EmitToken(ctx, tx, token, payload) })
	return r.Event.Arbor(), r.Created, err
}

// PendingEvents lists what a conversation waits for from outside: every
// task of it, at any depth, parked in an await (Run.AwaitEvent), with the
// token that answers it. An unknown conversation is arbortype.ErrNotFound.
func (e *Engine) PendingEvents(ctx context.Context, conversationID string) ([]arbortype.PendingEvent, error) {
	ts, err := core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Task, error) {
		return e.core.PendingAwaits(ctx, db, conversationID)
	})
	if err != nil {
		return nil, err
	}
	out := make([]arbortype.PendingEvent, len(ts))
	for i, t := range ts {
		out[i] = arbortype.PendingEvent{TaskID: t.ID, Kind: t.Kind, OwnerID: t.OwnerID, Name: t.AwaitName,
			Token: t.AwaitToken, Timeout: t.WakeAt}
	}
	return out, nil
}

// Events lists up to limit (1..10,000) events of a conversation with ids
// after after (0: from the first), in the order they were emitted: every
// emit by name and every answer to a token, with what became of it —
// DeliveredTo is the task it woke, 0 while it waits for an await of its
// name (an event addressed to a task that settled first waits so for
// ever). A steered message (arbortype.TurnSteer) is one, addressed to the turn it
// was sent to. An unknown conversation is arbortype.ErrNotFound.
func (e *Engine) Events(ctx context.Context, conversationID string, after int64, limit int) ([]arbortype.Event, error) {
	evs, err := core.Read(ctx, e.core, func(db store.DB) ([]store.Event, error) {
		return e.core.Events(ctx, db, conversationID, after, limit)
	})
	if err != nil {
		return nil, err
	}
	out := make([]arbortype.Event, len(evs))
	for i, ev := range evs {
		out[i] = ev.Arbor()
	}
	return out, nil
}
