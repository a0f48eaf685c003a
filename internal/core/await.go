package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

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
