package core

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// Lease names a holder's hold on a conversation: who holds it and the epoch
// it took the lease at (docs/design.md §3.8). Every start under the lease is
// fenced by it.
type Lease struct {
	ConversationID string
	Holder         string
	Epoch          int64
}

// TakeLease gives the conversation to holder with a fresh epoch and a lease
// of ttl, if it is free or its lease expired, and leaves its row locked
// until tx ends: the caller recovers the conversation under that lock
// (package reconcile) before it commits. ErrLeaseHeld when a live holder
// has it (or a transaction is taking it right now), ErrNotFound when the
// conversation does not exist.
func (e *Engine) TakeLease(ctx context.Context, tx pgx.Tx, conversationID, holder string, ttl time.Duration) (Lease, error) {
	c, err := e.Store.TakeConversation(ctx, tx, conversationID, holder, ttl)
	if store.IsNoRows(err) {
		if _, gerr := e.Store.GetConversation(ctx, tx, conversationID); store.IsNoRows(gerr) {
			return Lease{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, ErrNotFound)
		}
		return Lease{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, ErrLeaseHeld)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, err)
	}
	return Lease{ConversationID: c.ID, Holder: c.Holder, Epoch: c.Epoch}, nil
}

// Fence share-locks the lease's conversation if the lease still holds: a
// take-over waits for tx, or came first and tx gets ErrLeaseLost.
func (e *Engine) Fence(ctx context.Context, tx pgx.Tx, l Lease) error {
	err := e.Store.FenceConversation(ctx, tx, l.ConversationID, l.Holder, l.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d: %w", l.ConversationID, l.Epoch, ErrLeaseLost)
	}
	return err
}

// LockLease locks the lease's conversation for an update (a release, which
// recovers the holder's running tasks first) if the lease still holds;
// ErrLeaseLost when it does not.
func (e *Engine) LockLease(ctx context.Context, tx pgx.Tx, l Lease) error {
	_, err := e.Store.LockHeldConversation(ctx, tx, l.ConversationID, l.Holder, l.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d: %w", l.ConversationID, l.Epoch, ErrLeaseLost)
	}
	return err
}

// ReleaseLease frees the lease's conversation. It reports whether it did
// (false: it had been taken over already).
func (e *Engine) ReleaseLease(ctx context.Context, tx pgx.Tx, l Lease) (bool, error) {
	return e.Store.ReleaseConversation(ctx, tx, l.ConversationID, l.Holder, l.Epoch)
}

// RenewLeases extends the leases holder holds on ids at epochs (same index)
// in one statement and returns the ids it renewed: a missing one was taken
// over.
func (e *Engine) RenewLeases(ctx context.Context, db store.DB, holder string, ids []string, epochs []int64, ttl time.Duration) ([]string, error) {
	return e.Store.RenewConversations(ctx, db, holder, ids, epochs, ttl)
}

func (e *Engine) run(l Lease) (store.Run, error) {
	to, err := fsm.Transition(arbortype.StatusPending, fsm.Start)
	if err != nil {
		return store.Run{}, err
	}
	return store.Run{Status: to, Epoch: l.Epoch, Lease: e.Cfg.TaskLease}, nil
}

// Start moves a pending task of the lease's conversation to running with a
// fresh fencing token and a task lease, fenced by the lease: the
// conversation is share-locked at the lease's epoch in the same
// transaction. A second starter gets ErrAlreadyRunning; a task being aborted
// is never started (ErrAborted); a task of another conversation is
// ErrForeignTask.
func (e *Engine) Start(ctx context.Context, tx pgx.Tx, l Lease, taskID int64) (Task, error) {
	run, err := e.run(l)
	if err != nil {
		return Task{}, err
	}
	if err := e.Fence(ctx, tx, l); err != nil {
		return Task{}, errorf("start", taskID, err)
	}
	task, err := e.Store.StartTask(ctx, tx, l.ConversationID, taskID, run)
	if err == nil {
		return task, nil
	}
	if !store.IsNoRows(err) {
		return Task{}, errorf("start", taskID, mapDBError(err))
	}
	// Not started: read the row (the update waited for any lock on it, so
	// this is what won) and say why.
	cur, err := e.Store.GetTask(ctx, tx, taskID)
	switch {
	case store.IsNoRows(err):
		return Task{}, errorf("start", taskID, ErrNotFound)
	case err != nil:
		return Task{}, errorf("start", taskID, err)
	case cur.ConversationID != l.ConversationID:
		return Task{}, errorf("start", taskID, fmt.Errorf("it is in conversation %q, not %q: %w", cur.ConversationID, l.ConversationID, ErrForeignTask))
	case cur.AbortRequested || cur.Status == arbortype.StatusAborted || cur.Status == arbortype.StatusOrphaned:
		return Task{}, errorf("start", taskID, ErrAborted)
	case cur.Status == arbortype.StatusRunning:
		return Task{}, errorf("start", taskID, ErrAlreadyRunning)
	}
	return Task{}, errorf("start", taskID, transitionError(taskID, cur.Status, fsm.Start))
}

// ClaimParams select what a holder claims in its conversation.
type ClaimParams struct {
	// Kinds are the task kinds the holder has handlers for; nil claims any.
	Kinds []string
	// Roots are the root tasks the holder may start (the generation rule
	// is the caller's); children of any root are claimable. Nil: every
	// pending root.
	Roots []int64
	// Limit is the most tasks to claim, 1 to 10,000.
	Limit int
}

// Claim starts up to p.Limit pending tasks of the lease's conversation,
// oldest first, each with its own token, fenced by the lease like Start.
func (e *Engine) Claim(ctx context.Context, tx pgx.Tx, l Lease, p ClaimParams) ([]Task, error) {
	if p.Limit < 1 || p.Limit > 10_000 {
		return nil, fmt.Errorf("claim in conversation %q: limit %d is outside 1..10000: %w", l.ConversationID, p.Limit, ErrInvalidArgument)
	}
	run, err := e.run(l)
	if err != nil {
		return nil, err
	}
	if err := e.Fence(ctx, tx, l); err != nil {
		return nil, fmt.Errorf("claim in conversation %q: %w", l.ConversationID, err)
	}
	claimed, err := e.Store.ClaimRunnable(ctx, tx, l.ConversationID, p.Kinds, p.Roots, p.Limit, run)
	if err != nil {
		return nil, fmt.Errorf("claim in conversation %q: %w", l.ConversationID, mapDBError(err))
	}
	return claimed, nil
}
