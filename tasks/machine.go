package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// Fence names a machine's hold on a conversation: the owner and the epoch
// it took the lease at (DESIGN §3.8).
type Fence struct {
	ConversationID string
	Owner          string
	Epoch          int64
}

// ClaimRunnableParams select what a machine claims in its conversation.
type ClaimRunnableParams struct {
	Fence Fence
	// Kinds are the task kinds the machine has handlers for. Required.
	Kinds []string
	// Roots are the root tasks the machine may start (the generation rule
	// is the caller's); children of any root are claimable.
	Roots []int64
	// Limit is the most tasks to claim, 1 to 10,000.
	Limit int
}

// ClaimRunnable starts up to p.Limit pending tasks of the fenced
// conversation, oldest first, each with its own token, if the fence still
// holds: the conversation is share-locked at the fence's epoch in the same
// transaction, so a take-over either waits for the claim (and then recovers
// what it started) or comes first (and the claim gets ErrLeaseLost, having
// started nothing).
func (e *Engine) ClaimRunnable(ctx context.Context, p ClaimRunnableParams) (claimed []Task, err error) {
	if p.Limit < 1 || p.Limit > 10_000 {
		return nil, fmt.Errorf("claim runnable: limit %d is outside 1..10000: %w", p.Limit, ErrInvalidArgument)
	}
	to, err := fsm.Transition(fsm.Pending, fsm.Start)
	if err != nil {
		return nil, err
	}
	err = e.inTx(ctx, func(tx pgx.Tx) error {
		if err := e.fence(ctx, tx, p.Fence); err != nil {
			return err
		}
		claimed, err = e.store.ClaimRunnable(ctx, tx, p.Fence.ConversationID, p.Kinds, p.Roots, p.Limit, to, e.cfg.LeaseDuration)
		if err != nil {
			return fmt.Errorf("claim runnable in %q: %w", p.Fence.ConversationID, mapDBError(err))
		}
		return nil
	})
	return claimed, err
}

// fence share-locks the conversation if the fence still holds.
func (e *Engine) fence(ctx context.Context, tx pgx.Tx, f Fence) error {
	err := e.store.FenceConversation(ctx, tx, f.ConversationID, f.Owner, f.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d: %w", f.ConversationID, f.Epoch, ErrLeaseLost)
	}
	return err
}
