package core

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/awaittoken"
	"github.com/arborhq/arbor/internal/store"
)

// Events and awaits (docs/agents.md, docs/design.md §4 invariant 5).
//
// No event is lost, in any order. An emit and an await of a conversation
// both hold its row (conversation first, as every multi-task write does), so
// one of them sees the other:
//   - emitted before the await parks: the event waits undelivered, and the
//     await takes it in the transaction that would park it (the task parks
//     and wakes at once, like a satisfied wait);
//   - emitted while the await is parked: the emit delivers it, waking the
//     task, in its own transaction;
//   - emitted after the await ended (delivered, timed out, the task
//     settled): the event waits for the next await of its name, if any.
// A delivery or a settle of an awaiting task drops its timeout's wake job
// in the same transaction, as a sleep's.
//
// That is for an event addressed by name, to the conversation or to a
// task. An await's token names one await, not a name: posted after that
// await ended, it is refused (ErrAwaitEnded) and nothing is kept for the
// next await (see EmitToken).

// MaxEventBytes bounds an event's or a progress entry's payload.
const MaxEventBytes = 64 << 10

// EmitParams describe an emit (see tasks.Engine.Emit).
type EmitParams struct {
	ConversationID string
	// TaskID addresses the event to one task of the conversation; 0
	// addresses the conversation (the oldest task awaiting the name takes
	// it).
	TaskID int64
	Name   string
	// Payload is the event's JSON; empty for none.
	Payload json.RawMessage
	// Queue: every emit is one delivery, in order. Otherwise the first emit
	// of the name at the address wins, and later ones return it — until an
	// await of the name is parked there again (see emitLocked).
	Queue bool
	// IdempotencyKey makes a repeated emit return the first one.
	IdempotencyKey string
}

// Emitted is what an emit came to.
type Emitted struct {
	Event store.Event
	// Created is false when the emit was a repeat (its key, or a first-wins
	// name already emitted) and changed nothing.
	Created bool
	// Delivered is the task the event woke in this emit; 0 when none
	// awaited it (it waits for the next await of its name).
	Delivered int64
}

// Emit emits an event in tx.
func (e *Engine) Emit(ctx context.Context, tx pgx.Tx, p EmitParams) (Emitted, error) {
	if err := e.checkEmit(p); err != nil {
		return Emitted{}, fmt.Errorf("emit: %w", err)
	}
	if p.TaskID < 0 {
		return Emitted{}, fmt.Errorf("emit: task id %d: %w", p.TaskID, arbortype.ErrInvalidArgument)
	}
	what := fmt.Sprintf("emit %q to conversation %q", p.Name, p.ConversationID)
	if _, err := e.Store.LockConversation(ctx, tx, p.ConversationID); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return Emitted{}, fmt.Errorf("%s: %w", what, err)
	}
	// A repeat (its key) returns the first emit, whatever became of its
	// task since.
	if p.IdempotencyKey != "" {
		ev, found, err := e.emitted(ctx, tx, p.ConversationID, p.IdempotencyKey)
		switch {
		case err != nil:
			return Emitted{}, fmt.Errorf("%s: %w", what, err)
		case found && (ev.Name != p.Name || ev.TaskID != p.TaskID):
			return Emitted{}, fmt.Errorf("%s: key %q is event %d (%q to task %d): %w", what, p.IdempotencyKey, ev.ID, ev.Name, ev.TaskID, arbortype.ErrIdempotencyConflict)
		case found:
			return Emitted{Event: ev}, nil
		}
	}
	var target Task
	if p.TaskID != 0 {
		t, err := e.Store.LockTask(ctx, tx, p.ConversationID, p.TaskID)
		switch {
		case store.IsNoRows(err):
			// Not a task of the conversation: of another one, or none.
			other, oerr := e.Store.TaskConversation(ctx, tx, p.TaskID)
			switch {
			case oerr == nil:
				return Emitted{}, fmt.Errorf("%s: task %d is in conversation %q: %w", what, p.TaskID, other, arbortype.ErrForeignTask)
			case !store.IsNoRows(oerr):
				return Emitted{}, fmt.Errorf("%s: %w", what, oerr)
			}
			return Emitted{}, fmt.Errorf("%s: task %d: %w", what, p.TaskID, arbortype.ErrNotFound)
		case err != nil:
			return Emitted{}, fmt.Errorf("%s: %w", what, err)
		case t.Status.Settled():
			return Emitted{}, fmt.Errorf("%s: task %d is %s: %w", what, p.TaskID, t.Status, arbortype.ErrSettled)
		}
		target = t
	}
	out, err := e.emitLocked(ctx, tx, p, target)
	if err != nil {
		return Emitted{}, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// checkEmit checks an emit's texts and payload.
func (e *Engine) checkEmit(p EmitParams) error {
	if err := checkText("conversation id", p.ConversationID, true); err != nil {
		return err
	}
	if err := checkText("event name", p.Name, true); err != nil {
		return err
	}
	if err := checkText("idempotency key", p.IdempotencyKey, false); err != nil {
		return err
	}
	return e.checkPayload("event payload", p.Payload)
}

// emitted reads the event of conv emitted with key, if any.
func (e *Engine) emitted(ctx context.Context, tx pgx.Tx, conv, key string) (store.Event, bool, error) {
	ev, err := e.Store.EventByKey(ctx, tx, conv, key)
	switch {
	case err == nil:
		return ev, true, nil
	case store.IsNoRows(err):
		return store.Event{}, false, nil
	}
	return store.Event{}, false, err
}

// emitLocked emits p (checked, its conversation locked, not a repeat of
// its key) and delivers it to the await it is for, if one is parked now:
// target's (locked), when p is addressed to a task, else the oldest of the
// conversation's awaits of its name.
//
// A first-wins emit (not p.Queue) is a repeat of the newest first-wins
// event of its name at its address, and returns it, unless an await of the
// name is parked at the address now: that earlier event answered an
// earlier await (it was delivered: a parked await takes an undelivered
// event when it parks), and this emit is the answer to the one parked — a
// task that asks for an approval twice gets two answers. With nobody
// awaiting, a repeat is a second click on the decision already made.
func (e *Engine) emitLocked(ctx context.Context, tx pgx.Tx, p EmitParams, target Task) (Emitted, error) {
	var awaiter Task
	if p.TaskID != 0 {
		if target.ID != 0 && awaiting(target) && target.AwaitName == p.Name {
			awaiter = target
		}
	} else {
		t, err := e.Store.OldestAwaiting(ctx, tx, p.ConversationID, p.Name)
		switch {
		case err == nil:
			awaiter = t
		case !store.IsNoRows(err):
			return Emitted{}, err
		}
	}
	if !p.Queue {
		ev, err := e.Store.FirstWinsEvent(ctx, tx, p.ConversationID, p.Name, p.TaskID)
		switch {
		case err == nil && awaiter.ID == 0:
			return Emitted{Event: ev}, nil
		case err != nil && !store.IsNoRows(err):
			return Emitted{}, err
		}
	}
	ev, err := e.Store.InsertEvent(ctx, tx, p.ConversationID, p.TaskID, p.Name, p.Payload, p.IdempotencyKey, p.Queue)
	if err != nil {
		return Emitted{}, mapDBError(err)
	}
	logPayload, err := json.Marshal(map[string]any{"event_id": ev.ID, "payload": ev.Payload})
	if err != nil {
		return Emitted{}, err
	}
	if _, err := e.Store.AppendLog(ctx, tx, p.ConversationID, p.TaskID, arbortype.LogKindEvent, p.Name, logPayload); err != nil {
		return Emitted{}, fmt.Errorf("log: %w", mapDBError(err))
	}
	out := Emitted{Event: ev, Created: true}
	if awaiter.ID != 0 {
		if _, err := e.deliverLocked(ctx, tx, awaiter, &ev); err != nil {
			return Emitted{}, err
		}
		out.Delivered = awaiter.ID
		out.Event.DeliveredTo = awaiter.ID
	}
	return out, nil
}

// awaiting reports whether t is parked in an await now.
func awaiting(t Task) bool {
	return t.Status == arbortype.StatusSleeping && t.AwaitName != ""
}

// deliverLocked wakes t, a locked awaiting task, with ev (nil: its timeout
// came), dropping its timeout's wake job.
func (e *Engine) deliverLocked(ctx context.Context, tx pgx.Tx, t Task, ev *store.Event) (Task, error) {
	to, err := fsm.Transition(t.Status, fsm.Wake)
	if err != nil {
		return Task{}, transitionError(t.ID, t.Status, fsm.Wake)
	}
	if err := e.dropWakeJobs(ctx, tx, t); err != nil {
		return Task{}, err
	}
	d := arbortype.Delivered{Name: t.AwaitName, TimedOut: ev == nil}
	if ev != nil {
		if err := e.Store.MarkDelivered(ctx, tx, ev.ConversationID, ev.ID, t.ID); err != nil {
			return Task{}, mapDBError(err)
		}
		at := ev.EmittedAt
		d.EventID, d.Payload, d.EmittedAt = ev.ID, ev.Payload, &at
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return Task{}, err
	}
	woken, err := e.Store.DeliverTask(ctx, tx, t.ConversationID, t.ID, to, raw)
	if err != nil {
		return Task{}, mapDBError(err)
	}
	if ev != nil {
		if own, ok := steeredTurn(ev.IdempotencyKey); ok {
			if err := e.takeSteered(ctx, tx, woken, ev, own); err != nil {
				return Task{}, err
			}
		}
	}
	return woken, nil
}

// EmitToken answers the await whose token is token with payload: an event
// of the await's name addressed to its task, emitted once however often the
// token is posted (the token is the emit's idempotency key).
//
// A token answers its own await, while it lasts, and nothing else. Once
// that await is over — its event came, it timed out, the task was woken,
// cancelled, aborted or settled, or it awaited again — the token is
// refused with ErrAwaitEnded and nothing is written: an answer posted late
// is never kept for a later await, which would take it at once (an
// approval nobody gave to that await). A repeat of a token that was
// accepted returns its emit (created false) whatever became of the await
// since: the key is looked up first. All of it runs under the
// conversation's lock, as an emit, a timeout and an await do, so a token
// racing its timeout is either the await's answer or refused.
func (e *Engine) EmitToken(ctx context.Context, tx pgx.Tx, token string, payload json.RawMessage) (Emitted, error) {
	if err := checkText("await token", token, true); err != nil {
		return Emitted{}, fmt.Errorf("emit to token: %w", err)
	}
	if err := e.checkPayload("event payload", payload); err != nil {
		return Emitted{}, fmt.Errorf("emit to token: %w", err)
	}
	conv, taskID, err := e.tokenTask(ctx, tx, token)
	if err != nil {
		return Emitted{}, fmt.Errorf("emit to token: %w", err)
	}
	what := fmt.Sprintf("emit to token of task %d", taskID)
	if _, err := e.Store.LockConversation(ctx, tx, conv); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return Emitted{}, fmt.Errorf("%s: %w", what, err)
	}
	key := "arbor:token:" + token
	if ev, found, err := e.emitted(ctx, tx, conv, key); err != nil || found {
		if err != nil {
			return Emitted{}, fmt.Errorf("%s: %w", what, err)
		}
		return Emitted{Event: ev}, nil
	}
	t, err := e.Store.LockTask(ctx, tx, conv, taskID)
	switch {
	case store.IsNoRows(err):
		return Emitted{}, fmt.Errorf("%s: %w", what, arbortype.ErrNotFound)
	case err != nil:
		return Emitted{}, fmt.Errorf("%s: %w", what, err)
	case t.AwaitToken != token:
		return Emitted{}, fmt.Errorf("%s: the task is %s, and not in the await this token answered: %w", what, t.Status, arbortype.ErrAwaitEnded)
	case !awaiting(t):
		return Emitted{}, fmt.Errorf("%s: the task is %s, its await of %q over: %w", what, t.Status, t.AwaitName, arbortype.ErrAwaitEnded)
	case t.AwaitName == arbortype.BudgetEvent:
		// A budget's park: only a raise of the budget wakes it (SetBudget
		// emits BudgetEvent), or the task would run again over its budget.
		return Emitted{}, fmt.Errorf("%s: the task is parked on a budget (%s), which only a raise of the budget (SetBudget) ends: %w",
			what, arbortype.BudgetEvent, arbortype.ErrInvalidArgument)
	}
	p := EmitParams{ConversationID: conv, TaskID: t.ID, Name: t.AwaitName, Payload: payload, Queue: true, IdempotencyKey: key}
	out, err := e.emitLocked(ctx, tx, p, t)
	if err != nil {
		return Emitted{}, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// tokenTask finds, without locking, the conversation and the task of the
// await a token was issued for: by the task id it names, or, for a token
// of the older form, by the task that still holds it.
func (e *Engine) tokenTask(ctx context.Context, tx pgx.Tx, token string) (string, int64, error) {
	if id, ok := awaittoken.Task(token); ok {
		conv, err := e.Store.TaskConversation(ctx, tx, id)
		switch {
		case store.IsNoRows(err):
			return "", 0, fmt.Errorf("no await has this token (its task %d does not exist): %w", id, arbortype.ErrNotFound)
		case err != nil:
			return "", 0, err
		}
		return conv, id, nil
	}
	t, err := e.Store.TaskByAwaitToken(ctx, tx, token)
	switch {
	case store.IsNoRows(err):
		// A token of the older form is found by the task holding it: one
		// its task no longer holds (it awaited again) is not told apart
		// from one never issued.
		return "", 0, fmt.Errorf("no await has this token: %w", arbortype.ErrNotFound)
	case err != nil:
		return "", 0, err
	}
	return t.ConversationID, t.ID, nil
}

// Events reads up to limit (1..10,000) events of conv with ids after
// after, in id order: delivered or not, by name or by token. An unknown
// conversation is ErrNotFound.
func (e *Engine) Events(ctx context.Context, db store.DB, conv string, after int64, limit int) ([]store.Event, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	if after < 0 || limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("events of %q: after %d, limit %d (1..10000): %w", conv, after, limit, arbortype.ErrInvalidArgument)
	}
	evs, err := e.Store.ConversationEvents(ctx, db, conv, after, limit)
	if err != nil {
		return nil, fmt.Errorf("events of %q: %w", conv, err)
	}
	if len(evs) == 0 {
		if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
			if store.IsNoRows(err) {
				err = arbortype.ErrNotFound
			}
			return nil, fmt.Errorf("events of %q: %w", conv, err)
		}
	}
	return evs, nil
}

// checkPayload checks an event's or a progress entry's JSON: valid, and at
// most MaxEventBytes.
func (e *Engine) checkPayload(what string, payload json.RawMessage) error {
	if len(payload) > MaxEventBytes {
		return fmt.Errorf("%s: %d bytes, over the limit of %d: %w", what, len(payload), MaxEventBytes, arbortype.ErrPayloadTooLarge)
	}
	return e.checkJSON(what, payload)
}
