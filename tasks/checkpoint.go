package tasks

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// Checkpoint replaces a running task's phase and state (a whole new
// checkpoint, not a patch) and extends its lease by Config.LeaseDuration, in
// one statement that locks only the task's row. Only the run holding token
// may write: a stale token gets ErrLeaseLost, a task no longer running
// ErrNotRunning, a task being aborted ErrAborted; then nothing is written.
func (e *Engine) Checkpoint(ctx context.Context, taskID, token int64, phase string, state json.RawMessage) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.checkpoint(ctx, tx, taskID, token, phase, state)
		return err
	})
	return task, err
}

// CheckpointTx is Checkpoint inside the caller's transaction: the
// checkpoint commits with the caller's own rows, or not at all.
func (e *Engine) CheckpointTx(ctx context.Context, tx pgx.Tx, taskID, token int64, phase string, state json.RawMessage) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.checkpoint(ctx, tx, taskID, token, phase, state)
		return err
	})
	return task, err
}

func (e *Engine) checkpoint(ctx context.Context, tx pgx.Tx, taskID, token int64, phase string, state json.RawMessage) (Task, error) {
	if err := checkText("phase", phase, false); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if err := e.checkJSON("state", state); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if _, err := fsm.Transition(fsm.Running, fsm.Checkpoint); err != nil {
		return Task{}, err
	}
	task, err := e.store.CheckpointTask(ctx, tx, taskID, token, phase, state, e.cfg.LeaseDuration)
	if err == nil {
		return task, nil
	}
	return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, e.fencedOff(ctx, tx, taskID, token, err))
}

// Heartbeat extends a running task's lease by Config.LeaseDuration. It is
// fenced like Checkpoint.
func (e *Engine) Heartbeat(ctx context.Context, taskID, token int64) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.store.HeartbeatTask(ctx, tx, taskID, token, e.cfg.LeaseDuration)
		if err != nil {
			err = fmt.Errorf("heartbeat task %d: %w", taskID, e.fencedOff(ctx, tx, taskID, token, err))
		}
		return err
	})
	return task, err
}

// fencedOff explains why a fenced single-statement write matched no row.
func (e *Engine) fencedOff(ctx context.Context, tx pgx.Tx, taskID, token int64, err error) error {
	if !store.IsNoRows(err) {
		return mapDBError(err)
	}
	cur, err := e.store.GetTask(ctx, tx, taskID)
	switch {
	case store.IsNoRows(err):
		return ErrNotFound
	case err != nil:
		return err
	}
	return checkHolder(cur, token)
}

// checkHolder returns nil if token is the current run of cur, a running
// task not being aborted; otherwise the error its holder must see.
func checkHolder(cur Task, token int64) error {
	switch {
	case cur.AbortRequested || cur.Status == fsm.Aborted:
		return ErrAborted
	case cur.Status != fsm.Running:
		return fmt.Errorf("%w (it is %s)", ErrNotRunning, cur.Status)
	case cur.Token != token:
		return ErrLeaseLost
	}
	return nil
}
