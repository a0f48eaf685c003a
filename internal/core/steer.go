package core

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Steering (arbortype.TurnSteer): a message sent to a conversation while a turn
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
