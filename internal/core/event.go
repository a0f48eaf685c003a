package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
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

// Steering (tasks.TurnSteer): a message sent to a conversation while a turn
// is live goes to that turn as a queued event, and is also a turn of its
// own, created pending behind the live one, so that it is never lost: the
// live turn takes it at an await of the event's name (and its own turn is
// cancelled in that transaction, code CodeSteered), or settles without
// taking it (and its own turn runs when its time comes, as a queued turn,
// to answer it). The event's idempotency key names the message's turn.

// steerKeyPrefix starts a steered message's event key; its turn's id
// follows.
const steerKeyPrefix = "arbor:steer:"

// Steer steers a message (the create p, a root) into target, a live root
// of p's conversation, whose row lock the caller holds (LockLiveRoots):
// it creates the message's own turn from p and emits p.Input to target as
// a queued event named name, delivered at once when target awaits it now.
// created is false when p's idempotency key named a turn already (a
// repeated steer): nothing is written then.
func (e *Engine) Steer(ctx context.Context, tx pgx.Tx, target Task, p CreateParams, name string) (own Task, created bool, err error) {
	if p.OwnerID != 0 {
		return Task{}, false, fmt.Errorf("steer: a steered message is a root task: %w", arbortype.ErrInvalidArgument)
	}
	if err := checkText("event name", name, true); err != nil {
		return Task{}, false, fmt.Errorf("steer: %w", err)
	}
	own, created, err = e.Create(ctx, tx, p)
	if err != nil || !created {
		return own, created, err
	}
	if p.HasBudgets() {
		if err := e.ApplyCreateBudgets(ctx, tx, []CreateParams{p}, []Task{own}, []bool{true}); err != nil {
			return Task{}, false, err
		}
	}
	_, err = e.Emit(ctx, tx, EmitParams{ConversationID: p.ConversationID, TaskID: target.ID, Name: name,
		Payload: p.Input, Queue: true, IdempotencyKey: steerKeyPrefix + strconv.FormatInt(own.ID, 10)})
	if err != nil {
		return Task{}, false, fmt.Errorf("steer into task %d: %w", target.ID, err)
	}
	return own, true, nil
}

// SteeredInto returns the task the steered message whose own turn is
// ownID was steered into (the first steer's answer); false when ownID is
// no steered message's turn.
func (e *Engine) SteeredInto(ctx context.Context, db store.DB, conv string, ownID int64) (int64, bool, error) {
	ev, err := e.Store.EventByKey(ctx, db, conv, steerKeyPrefix+strconv.FormatInt(ownID, 10))
	switch {
	case store.IsNoRows(err):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return ev.TaskID, true, nil
}

// steeredTurn returns the id of the message's own turn a steered event's
// key names.
func steeredTurn(key string) (int64, bool) {
	rest, ok := strings.CutPrefix(key, steerKeyPrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(rest, 10, 64)
	return id, err == nil && id > 0
}

// takeSteered cancels the own turn of the steered message ev, which taker's
// await has just taken (code CodeSteered, its result naming taker and the
// event), unless it has moved past a cancel already (it completed, or is
// completing, or settled otherwise): then it answered the message itself.
func (e *Engine) takeSteered(ctx context.Context, tx pgx.Tx, taker Task, ev *store.Event, ownID int64) error {
	own, err := e.Store.LockTask(ctx, tx, taker.ConversationID, ownID)
	switch {
	case store.IsNoRows(err):
		return nil
	case err != nil:
		return err
	}
	if _, err := fsm.Transition(own.Status, fsm.Cancel); err != nil {
		return nil
	}
	if err := e.abortForegroundChildren(ctx, tx, own); err != nil {
		return err
	}
	result, err := json.Marshal(map[string]int64{"taken_by": taker.ID, "event": ev.ID})
	if err != nil {
		return err
	}
	_, err = e.settle(ctx, tx, own, fsm.Cancel, result, &TaskError{Code: arbortype.CodeSteered,
		Message: fmt.Sprintf("its message was taken by task %d (event %d)", taker.ID, ev.ID)})
	return err
}

// AwaitParams describe an await (see machine.Run.AwaitEvent).
type AwaitParams struct {
	// Name is the event awaited. Required.
	Name string
	// Timeout, when not 0, ends the await without an event after it (a
	// River job and a local timer, as a sleep's).
	Timeout time.Duration
	// Phase and State are saved with the await: the handler runs again from
	// them.
	Phase string
	State json.RawMessage
}

// AwaitResult is what an await came to.
type AwaitResult struct {
	Task Task
	// Woken: an event was waiting already; the task was parked and woken
	// with it in the same transaction.
	Woken bool
}

// AwaitEvent parks the running task held with token until an event of
// p.Name is emitted to it or to its conversation, or until p.Timeout.
func (e *Engine) AwaitEvent(ctx context.Context, tx pgx.Tx, taskID, token int64, p AwaitParams) (AwaitResult, error) {
	if err := checkText("event name", p.Name, true); err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	if p.Timeout < 0 || p.Timeout > 100*365*24*time.Hour {
		return AwaitResult{}, errorf("await", taskID, fmt.Errorf("timeout %s is outside 0..100 years: %w", p.Timeout, arbortype.ErrInvalidArgument))
	}
	if err := checkText("phase", p.Phase, false); err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	if err := e.checkJSON("state", p.State); err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	to, err := fsm.Transition(t.Status, fsm.Await)
	if err != nil {
		return AwaitResult{}, errorf("await", taskID, transitionError(taskID, t.Status, fsm.Await))
	}
	ev, err := e.Store.UndeliveredFor(ctx, tx, t.ConversationID, p.Name, taskID)
	found := err == nil
	if err != nil && !store.IsNoRows(err) {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	awaitToken, err := newAwaitToken(taskID)
	if err != nil {
		return AwaitResult{}, errorf("await", taskID, err)
	}
	var (
		wakeAt *time.Time
		jobID  int64
	)
	if !found && p.Timeout > 0 {
		at := time.Now().Add(p.Timeout)
		wakeAt = &at
		if jobID, err = e.insertWakeJob(ctx, tx, t, at); err != nil {
			return AwaitResult{}, errorf("await", taskID, err)
		}
	}
	parked, err := e.Store.AwaitTask(ctx, tx, t.ConversationID, taskID, to, p.Phase, p.State, p.Name, awaitToken, wakeAt, jobID)
	if err != nil {
		return AwaitResult{}, errorf("await", taskID, mapDBError(err))
	}
	if found {
		woken, err := e.deliverLocked(ctx, tx, parked, &ev)
		if err != nil {
			return AwaitResult{}, errorf("await", taskID, err)
		}
		return AwaitResult{Task: woken, Woken: true}, nil
	}
	if wakeAt != nil {
		if err := e.announceSleep(ctx, tx, parked); err != nil {
			return AwaitResult{}, errorf("await", taskID, err)
		}
	}
	return AwaitResult{Task: parked}, nil
}

// newAwaitToken returns an unguessable token for one await of task
// taskID: "awt_", the task's id, "_", 128 random bits in hex. The id is
// what finds the await's conversation once the token is no longer the
// task's (it awaited again), so that the token can still be told apart
// from one never issued (ErrAwaitEnded, or its first emit again, rather
// than ErrNotFound); the random part is what makes it unguessable.
func newAwaitToken(taskID int64) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "awt_" + strconv.FormatInt(taskID, 10) + "_" + hex.EncodeToString(b), nil
}

// awaitTokenTask returns the task id a token names (see newAwaitToken);
// false for a token of another form (one issued before tokens named their
// task, or not arbor's).
func awaitTokenTask(token string) (int64, bool) {
	rest, ok := strings.CutPrefix(token, "awt_")
	if !ok {
		return 0, false
	}
	id, random, ok := strings.Cut(rest, "_")
	if !ok || len(random) != 32 {
		return 0, false
	}
	if _, err := hex.DecodeString(random); err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != id {
		return 0, false
	}
	return n, true
}

// PendingAwaits lists the tasks of a conversation awaiting an event, at any
// depth.
func (e *Engine) PendingAwaits(ctx context.Context, db store.DB, conv string) ([]Task, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("pending events: %w", err)
	}
	if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return nil, fmt.Errorf("pending events of %q: %w", conv, err)
	}
	ts, err := e.Store.PendingAwaits(ctx, db, conv)
	if err != nil {
		return nil, fmt.Errorf("pending events of %q: %w", conv, err)
	}
	return ts, nil
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
	if id, ok := awaitTokenTask(token); ok {
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

// ReadLog reads up to limit entries of a conversation's log after seq
// after, in order. An unknown conversation is ErrNotFound.
func (e *Engine) ReadLog(ctx context.Context, db store.DB, conv string, after int64, limit int) ([]store.LogEntry, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	if after < 0 || limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("read log of %q: after %d, limit %d (1..10000): %w", conv, after, limit, arbortype.ErrInvalidArgument)
	}
	entries, err := e.Store.ReadLog(ctx, db, conv, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read log of %q: %w", conv, err)
	}
	if len(entries) == 0 {
		// Nothing after the cursor: of a conversation, or of none (a
		// follower of a conversation that does not exist would wait for
		// ever).
		if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
			if store.IsNoRows(err) {
				err = arbortype.ErrNotFound
			}
			return nil, fmt.Errorf("read log of %q: %w", conv, err)
		}
	}
	return entries, nil
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
