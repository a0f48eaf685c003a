package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// Start moves a pending task to running with a fresh fencing token (the
// returned Task.Token) and a lease of Config.LeaseDuration; started_at is set
// at its first start and attempt is unchanged. It locks only the task's row.
// A second caller racing for the same task gets ErrAlreadyRunning; a task
// being aborted is never started (ErrAborted).
func (e *Engine) Start(ctx context.Context, taskID int64) (task Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		task, err = e.start(ctx, tx, taskID)
		return err
	})
	return task, err
}

// StartTx is Start inside the caller's transaction.
func (e *Engine) StartTx(ctx context.Context, tx pgx.Tx, taskID int64) (task Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		task, err = e.start(ctx, tx, taskID)
		return err
	})
	return task, err
}

func (e *Engine) start(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	to, err := fsm.Transition(fsm.Pending, fsm.Start)
	if err != nil {
		return Task{}, err
	}
	task, err := e.store.StartTask(ctx, tx, taskID, to, e.cfg.LeaseDuration)
	if err == nil {
		return task, nil
	}
	if !store.IsNoRows(err) {
		return Task{}, fmt.Errorf("start task %d: %w", taskID, mapDBError(err))
	}
	// Not started: read the row (the update waited for any lock on it, so
	// this is what won) and say why.
	cur, err := e.store.GetTask(ctx, tx, taskID)
	switch {
	case store.IsNoRows(err):
		return Task{}, fmt.Errorf("start task %d: %w", taskID, ErrNotFound)
	case err != nil:
		return Task{}, fmt.Errorf("start task %d: %w", taskID, err)
	case cur.AbortRequested || cur.Status == fsm.Aborted || cur.Status == fsm.Orphaned:
		return Task{}, fmt.Errorf("start task %d: %w", taskID, ErrAborted)
	case cur.Status == fsm.Running:
		return Task{}, fmt.Errorf("start task %d: %w", taskID, ErrAlreadyRunning)
	}
	return Task{}, fmt.Errorf("start task %d: %w", taskID, transitionError(taskID, cur.Status, fsm.Start))
}

// ClaimParams select the tasks Claim starts.
type ClaimParams struct {
	// ConversationID limits the claim to one conversation; "" claims from
	// every conversation.
	ConversationID string
	// Limit is the most tasks to claim. Required, 1 to 10,000.
	Limit int
}

// Claim starts up to p.Limit pending tasks, oldest first, in one statement
// that skips rows other transactions hold (FOR UPDATE SKIP LOCKED): two
// claimers never get the same task and never wait for each other. Each
// claimed task gets its own fencing token. Tasks being aborted are never
// claimed.
func (e *Engine) Claim(ctx context.Context, p ClaimParams) (claimed []Task, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		claimed, err = e.claim(ctx, tx, p)
		return err
	})
	return claimed, err
}

// ClaimTx is Claim inside the caller's transaction.
func (e *Engine) ClaimTx(ctx context.Context, tx pgx.Tx, p ClaimParams) (claimed []Task, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		claimed, err = e.claim(ctx, tx, p)
		return err
	})
	return claimed, err
}

func (e *Engine) claim(ctx context.Context, tx pgx.Tx, p ClaimParams) ([]Task, error) {
	if p.Limit < 1 || p.Limit > 10_000 {
		return nil, fmt.Errorf("claim: limit %d is outside 1..10000: %w", p.Limit, ErrInvalidArgument)
	}
	if err := checkText("conversation id", p.ConversationID, false); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	to, err := fsm.Transition(fsm.Pending, fsm.Start)
	if err != nil {
		return nil, err
	}
	claimed, err := e.store.ClaimTasks(ctx, tx, p.ConversationID, p.Limit, to, e.cfg.LeaseDuration)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", mapDBError(err))
	}
	return claimed, nil
}
