package core

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// The run's self-only writes: a checkpoint, a heartbeat and a progress
// entry are each one statement fenced by the run's token (its task held
// with it, running, not being aborted), which writes nothing when the
// fence holds no more. db is a connection of the pool, where the statement
// commits on its own (machine's writeAtOnce: one round trip), or the
// caller's transaction (the …Tx forms). Only a refused write reads the task
// again, to say why (fencedOff): ErrAborted, ErrNotRunning or ErrLeaseLost,
// or ErrNotFound.

// Checkpoint replaces a running task's phase and state and extends its task
// lease, fenced by token (see machine.Run.Checkpoint).
func (e *Engine) Checkpoint(ctx context.Context, db store.DB, conv string, taskID, token int64, phase string, state json.RawMessage) (Task, error) {
	if err := checkText("phase", phase, false); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if err := e.checkJSON("state", state); err != nil {
		return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, err)
	}
	if _, err := fsm.Transition(arbortype.StatusRunning, fsm.Checkpoint); err != nil {
		return Task{}, err
	}
	task, err := e.Store.CheckpointTask(ctx, db, conv, taskID, token, phase, state, e.Cfg.TaskLease)
	if err == nil {
		return task, nil
	}
	return Task{}, fmt.Errorf("checkpoint task %d: %w", taskID, e.fencedOff(ctx, db, taskID, token, err))
}

// Heartbeat extends a running task's lease by Config.LeaseDuration. It is
// fenced like Checkpoint.
func (e *Engine) Heartbeat(ctx context.Context, db store.DB, conv string, taskID, token int64) (Task, error) {
	task, err := e.Store.HeartbeatTask(ctx, db, conv, taskID, token, e.Cfg.TaskLease)
	if err != nil {
		return Task{}, errorf("heartbeat", taskID, e.fencedOff(ctx, db, taskID, token, err))
	}
	return task, nil
}

// Progress appends a progress entry to conv's log for the running task held
// with token, locking the conversation first (the log's order is its
// commit order; see store's qAppendProgress) without announcing it to the
// runners: the caller announces it to the log's followers after the commit
// (AnnounceLog).
func (e *Engine) Progress(ctx context.Context, db store.DB, conv string, taskID, token int64, name string, payload json.RawMessage) (int64, error) {
	if err := checkText("progress name", name, false); err != nil {
		return 0, errorf("progress", taskID, err)
	}
	if err := e.checkPayload("progress payload", payload); err != nil {
		return 0, errorf("progress", taskID, err)
	}
	seq, err := e.Store.AppendProgress(ctx, db, conv, taskID, token, name, payload)
	if err != nil {
		return 0, errorf("progress", taskID, e.fencedOff(ctx, db, taskID, token, err))
	}
	return seq, nil
}

// fencedOff explains why a fenced single-statement write matched no row,
// reading the task again (a second statement, on the refusal path only).
func (e *Engine) fencedOff(ctx context.Context, db store.DB, taskID, token int64, err error) error {
	if !store.IsNoRows(err) {
		return mapDBError(err)
	}
	cur, err := e.Store.GetTask(ctx, db, taskID)
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
