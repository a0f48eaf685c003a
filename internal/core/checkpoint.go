package core

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Checkpoint replaces a running task's phase and state and extends its task
// lease, fenced by token (see machine.Run.Checkpoint).
func (e *Engine) Checkpoint(ctx context.Context, tx pgx.Tx, conv string, taskID, token int64, phase string, state json.RawMessage) (Task, error) {
	if err := checkText("phase", phase, false); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if err := e.checkJSON("state", state); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if _, err := fsm.Transition(arbortype.StatusRunning, fsm.Checkpoint); err != nil {
		return Task{}, err
	}
	task, err := e.Store.CheckpointTask(ctx, tx, conv, taskID, token, phase, state, e.Cfg.TaskLease)
	if err == nil {
		return task, nil
	}
	return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, e.fencedOff(ctx, tx, taskID, token, err))
}

// Heartbeat extends a running task's lease by Config.LeaseDuration. It is
// fenced like Checkpoint.
func (e *Engine) Heartbeat(ctx context.Context, tx pgx.Tx, conv string, taskID, token int64) (Task, error) {
	task, err := e.Store.HeartbeatTask(ctx, tx, conv, taskID, token, e.Cfg.TaskLease)
	if err != nil {
		return Task{}, errorf("heartbeat", taskID, e.fencedOff(ctx, tx, taskID, token, err))
	}
	return task, nil
}

// fencedOff explains why a fenced single-statement write matched no row.
func (e *Engine) fencedOff(ctx context.Context, tx pgx.Tx, taskID, token int64, err error) error {
	if !store.IsNoRows(err) {
		return mapDBError(err)
	}
	cur, err := e.Store.GetTask(ctx, tx, taskID)
	switch {
	case store.IsNoRows(err):
		return arbortype.ErrNotFound
	case err != nil:
		return err
	}
	return checkHolder(cur, token)
}

// checkHolder returns nil if token is the current run of cur, a running
// task not being aborted; otherwise the error its holder must see.
func checkHolder(cur Task, token int64) error {
	switch {
	case cur.AbortRequested || cur.Status == arbortype.StatusAborted:
		return arbortype.ErrAborted
	case cur.Status != arbortype.StatusRunning:
		return fmt.Errorf("%w (it is %s)", arbortype.ErrNotRunning, cur.Status)
	case cur.Token != token:
		return arbortype.ErrLeaseLost
	}
	return nil
}
