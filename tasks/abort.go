package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// AbortReport says what an abort settled.
type AbortReport struct {
	// Settled are the tasks the abort settled, leaves first (the order their
	// settles were recorded in); the target, when it was live, is last.
	Settled []Task
}

// Abort aborts taskID with every live descendant that is not background
// (DESIGN §3.6), in one transaction: all are marked abort_requested, then
// settled leaves first, each owner after all its children, the target last
// (aborted, or orphaned for a task that never ran); then the target's owner
// is reconciled. Background children, and everything under them, are left
// running. A child that tries to spawn under any of these tasks meanwhile is
// refused (ErrOwnerAborting), and a runner executing one of them gets
// ErrAborted at its next write. A settled target is a *TransitionError; an
// unknown one ErrNotFound.
func (e *Engine) Abort(ctx context.Context, taskID int64) (rep AbortReport, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		rep, err = e.abort(ctx, tx, taskID)
		return err
	})
	return rep, err
}

// AbortTx is Abort inside the caller's transaction.
func (e *Engine) AbortTx(ctx context.Context, tx pgx.Tx, taskID int64) (rep AbortReport, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		rep, err = e.abort(ctx, tx, taskID)
		return err
	})
	return rep, err
}

func (e *Engine) abort(ctx context.Context, tx pgx.Tx, taskID int64) (AbortReport, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	if t.Status.Settled() {
		return AbortReport{}, errorf("abort", taskID, transitionError(taskID, t.Status, fsm.Abort))
	}
	nodes, err := e.abortSubtrees(ctx, tx, []int64{taskID})
	if err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	rep := AbortReport{Settled: reversed(nodes)}
	target := rep.Settled[len(rep.Settled)-1]
	if err := e.reconcileOwner(ctx, tx, target); err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	return rep, nil
}

// AbortConversation aborts every live task of a conversation, background
// tasks included, leaves first, in one transaction. A conversation with
// nothing live is not an error: the report is empty. An unknown
// conversation is ErrNotFound.
func (e *Engine) AbortConversation(ctx context.Context, conversationID string) (rep AbortReport, err error) {
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		rep, err = e.abortConversation(ctx, tx, conversationID)
		return err
	})
	return rep, err
}

// AbortConversationTx is AbortConversation inside the caller's transaction.
func (e *Engine) AbortConversationTx(ctx context.Context, tx pgx.Tx, conversationID string) (rep AbortReport, err error) {
	err = inSavepoint(ctx, tx, func(tx pgx.Tx) error {
		rep, err = e.abortConversation(ctx, tx, conversationID)
		return err
	})
	return rep, err
}

func (e *Engine) abortConversation(ctx context.Context, tx pgx.Tx, conversationID string) (AbortReport, error) {
	if err := checkText("conversation id", conversationID, true); err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation: %w", err)
	}
	if _, err := e.store.LockConversation(ctx, tx, conversationID); err != nil {
		if store.IsNoRows(err) {
			err = ErrNotFound
		}
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	nodes, err := e.store.LockLiveConversationTasks(ctx, tx, conversationID)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	settled, err := e.abortLocked(ctx, tx, nodes)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	return AbortReport{Settled: reversed(settled)}, nil
}

func reversed(ts []Task) []Task {
	out := make([]Task, len(ts))
	for i, t := range ts {
		out[len(ts)-1-i] = t
	}
	return out
}
