package tasks

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// AbortReport says what an abort settled.
type AbortReport struct {
	// Settled are the tasks the abort settled, as it wrote them (status,
	// SettleSeq, SettledAt, and the reason as the target's Error), leaves
	// first (the order their settles were recorded in); the target, when it
	// was live, is last.
	Settled []arbortype.Task
}

// Abort aborts taskID with every live descendant that is not background
// (docs/design.md §3.6), in one transaction: all are marked abort_requested,
// then settled leaves first, each owner after all its children, the target
// last (aborted, or orphaned for a task that never ran); then the target's
// owner is reconciled (a waiting owner may wake). Background children, and
// everything under them, are left running. A child that tries to spawn under
// any of these tasks meanwhile is refused (arbortype.ErrOwnerAborting); a handler
// running one of them has its context cancelled within milliseconds and
// gets arbortype.ErrAborted at its next write. A settled target is a
// *TransitionError; an unknown one arbortype.ErrNotFound.
//
// WithReason records why (the user pressed stop, a new message interrupted
// the turn) as the target's error, code "aborted": arbor show, the
// conversation's log and the task's owner see it.
func (e *Engine) Abort(ctx context.Context, taskID int64, opts ...AbortOption) (AbortReport, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (AbortReport, error) { return e.abort(ctx, tx, taskID, opts) })
}

// AbortTx is Abort inside the caller's transaction.
func (e *Engine) AbortTx(ctx context.Context, tx pgx.Tx, taskID int64, opts ...AbortOption) (AbortReport, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (AbortReport, error) { return e.abort(ctx, tx, taskID, opts) })
}

func (e *Engine) abort(ctx context.Context, tx pgx.Tx, taskID int64, opts []AbortOption) (AbortReport, error) {
	rep, err := e.core.AbortWhy(ctx, tx, taskID, abortOptions(opts).reason)
	return AbortReport(rep), err
}

// AbortOption sets an option of an abort.
type AbortOption func(*abortOpts)

type abortOpts struct{ reason string }

// WithReason records reason (at most 200 bytes) as the aborted target's
// error, code arbortype.CodeAborted.
func WithReason(reason string) AbortOption { return func(o *abortOpts) { o.reason = reason } }

func abortOptions(opts []AbortOption) abortOpts {
	var o abortOpts
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// AbortTurn aborts the live turn of a conversation — the user pressed stop
// — as Abort aborts a task, in one transaction under the conversation's
// lock: its oldest live root task (the turn under way, or, none started
// yet, the next to run), with every live descendant that is not
// background. The conversation's background tasks, and the turns queued
// behind it, are left alone: the next queued turn runs next. With no live
// turn the report is empty and nothing is written (a stop pressed twice is
// no error); an unknown conversation is arbortype.ErrNotFound. WithReason
// records why.
func (e *Engine) AbortTurn(ctx context.Context, conversationID string, opts ...AbortOption) (AbortReport, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (AbortReport, error) { return e.abortTurn(ctx, tx, conversationID, opts) })
}

// AbortTurnTx is AbortTurn inside the caller's transaction.
func (e *Engine) AbortTurnTx(ctx context.Context, tx pgx.Tx, conversationID string, opts ...AbortOption) (AbortReport, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (AbortReport, error) { return e.abortTurn(ctx, tx, conversationID, opts) })
}

func (e *Engine) abortTurn(ctx context.Context, tx pgx.Tx, conversationID string, opts []AbortOption) (AbortReport, error) {
	rep, err := e.core.AbortTurnWhy(ctx, tx, conversationID, abortOptions(opts).reason)
	return AbortReport(rep), err
}

// AbortConversation aborts every live task of a conversation, background
// tasks included, leaves first, in one transaction: what the user's "stop"
// on the whole conversation means. A conversation with nothing live is not
// an error: the report is empty. An unknown conversation is arbortype.ErrNotFound.
// WithReason is recorded on the conversation's live root tasks.
func (e *Engine) AbortConversation(ctx context.Context, conversationID string, opts ...AbortOption) (AbortReport, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (AbortReport, error) { return e.abortConversation(ctx, tx, conversationID, opts) })
}

// AbortConversationTx is AbortConversation inside the caller's transaction.
func (e *Engine) AbortConversationTx(ctx context.Context, tx pgx.Tx, conversationID string, opts ...AbortOption) (AbortReport, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (AbortReport, error) { return e.abortConversation(ctx, tx, conversationID, opts) })
}

func (e *Engine) abortConversation(ctx context.Context, tx pgx.Tx, conversationID string, opts []AbortOption) (AbortReport, error) {
	rep, err := e.core.AbortConversationWhy(ctx, tx, conversationID, abortOptions(opts).reason)
	return AbortReport(rep), err
}

// Cancel is a user's cancel of a pending, running, waiting or sleeping
// task: its live foreground children are aborted first (each subtree
// leaves first), then the task becomes cancelled with result (optional)
// recorded, then its owner is reconciled, all in one transaction. A
// completing or settled task cannot be cancelled (*TransitionError); an
// unknown one is arbortype.ErrNotFound. A handler running the task has its context
// cancelled and gets arbortype.ErrNotRunning at its next write.
func (e *Engine) Cancel(ctx context.Context, taskID int64, result json.RawMessage) (arbortype.Task, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.Cancel(ctx, tx, taskID, result) })
}

// CancelTx is Cancel inside the caller's transaction.
func (e *Engine) CancelTx(ctx context.Context, tx pgx.Tx, taskID int64, result json.RawMessage) (arbortype.Task, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.Cancel(ctx, tx, taskID, result) })
}

// WakeNow is a user's early wake of a sleeping task (or of a retry's
// backoff): sleeping → pending at once, and its wake job removed in the same
// transaction, so that it neither wakes the task again nor lingers. A task
// that is not sleeping is arbortype.ErrNotSleeping (nothing is written); an unknown
// one arbortype.ErrNotFound.
func (e *Engine) WakeNow(ctx context.Context, taskID int64) (arbortype.Task, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.WakeNow(ctx, tx, taskID) })
}

// WakeNowTx is WakeNow inside the caller's transaction.
func (e *Engine) WakeNowTx(ctx context.Context, tx pgx.Tx, taskID int64) (arbortype.Task, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.WakeNow(ctx, tx, taskID) })
}

// Rerun runs a failed, aborted or cancelled task again from its last
// checkpoint, without forking its conversation (docs/design.md §3.17): a
// new pending task of the same conversation, owner, kind, input and
// options, carrying the source's phase and state, with RerunOf naming the
// source, which stays as it is. When the source's owner waits on the
// source, the rerun takes its place in that wait, so the owner resumes
// with the rerun's result. The source's own budgets are set on the rerun,
// unspent; its idempotency key stays with the source.
//
// A task is rerun at most once (rerun the rerun to go again). Refused, with
// nothing written: an unknown task (arbortype.ErrNotFound), a live one
// (arbortype.ErrNotSettled), a completed or orphaned one or one rerun
// already (arbortype.ErrInvalidTransition), one whose owner has settled or
// is being aborted (arbortype.ErrOwnerNotLive: rerun the owner or the turn).
func (e *Engine) Rerun(ctx context.Context, taskID int64) (arbortype.Task, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.Rerun(ctx, tx, taskID) })
}

// RerunTx is Rerun inside the caller's transaction.
func (e *Engine) RerunTx(ctx context.Context, tx pgx.Tx, taskID int64) (arbortype.Task, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) { return e.core.Rerun(ctx, tx, taskID) })
}
