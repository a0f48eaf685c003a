package core

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// Lease names a holder's hold on a conversation: who holds it (the
// holder's name, and its row in the holders table, whose deadline is the
// lease's) and the epoch it took the lease at (docs/design.md §3.8). Every
// start under the lease is fenced by the row and the epoch.
type Lease struct {
	ConversationID string
	Holder         string
	HolderID       int64
	Epoch          int64
}

// Taken is what a take-over found of the holder before it: whether the
// runs it recovers count as restarts (see Counted).
type Taken struct {
	// PrevHolder is the former holder's row (0: it had none).
	PrevHolder int64
	// PrevRestarted says the former holder's last renewal came before the
	// database server's start or its promotion: a restart or a failover
	// lapsed it, not its death.
	PrevRestarted bool
}

// Counted reports whether the runs a take-over recovers count as restarts
// (docs/design.md §3.8): when the holder before it lapsed — died, or lost
// its lease while running — and not when a database restart or a failover lapsed it, or
// when the taker is that holder itself (ownLives lists the holder rows of
// the taker's own earlier lives, whose runs it stopped itself).
func (t Taken) Counted(ownLives ...int64) bool {
	if t.PrevHolder == 0 || t.PrevRestarted {
		return false
	}
	return !slices.Contains(ownLives, t.PrevHolder)
}

// NewHolder inserts a holder row (a life) named name, live for ttl, and
// returns its id and its birth.
func (e *Engine) NewHolder(ctx context.Context, db store.DB, name string, ttl time.Duration) (int64, time.Time, error) {
	if err := checkText("holder", name, true); err != nil {
		return 0, time.Time{}, fmt.Errorf("new holder: %w", err)
	}
	id, created, err := e.Store.NewHolder(ctx, db, name, ttl)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("new holder %q: %w", name, mapDBError(err))
	}
	return id, created, nil
}

// DatabaseIdentity names the database (its cluster's system identifier and
// its name) together with arbor's schema: what a life lock file belongs to.
func (e *Engine) DatabaseIdentity(ctx context.Context, db store.DB) (string, error) {
	id, err := e.Store.DatabaseIdentity(ctx, db)
	if err != nil {
		return "", fmt.Errorf("database identity: %w", mapDBError(err))
	}
	return id + "/" + e.Store.Schema(), nil
}

// EndDeadHolder ends holder row id (named name, born created), proven dead
// by holder row by, and reports whether it did: false when that life is
// gone, expired or ended already.
func (e *Engine) EndDeadHolder(ctx context.Context, db store.DB, id int64, name string, created time.Time, by int64) (bool, error) {
	ok, err := e.Store.EndDeadHolder(ctx, db, id, name, created, by)
	if err != nil {
		return false, fmt.Errorf("end dead holder %d: %w", id, mapDBError(err))
	}
	return ok, nil
}

// RenewHolder extends holder row id by ttl from now and reports whether it
// did: false when the row had expired (its conversations may have been
// taken over; the holder must start a new life).
func (e *Engine) RenewHolder(ctx context.Context, db store.DB, id int64, ttl time.Duration) (bool, error) {
	ok, err := e.Store.RenewHolder(ctx, db, id, ttl)
	if err != nil {
		return false, fmt.Errorf("renew holder %d: %w", id, mapDBError(err))
	}
	return ok, nil
}

// EndHolder removes holder row id once it holds nothing (a stopped runner,
// a released Lease); it reports whether it did.
func (e *Engine) EndHolder(ctx context.Context, db store.DB, id int64) (bool, error) {
	ok, err := e.Store.EndHolder(ctx, db, id)
	if err != nil {
		return false, fmt.Errorf("end holder %d: %w", id, mapDBError(err))
	}
	return ok, nil
}

// PruneHolders removes up to limit holder rows expired for longer than
// after that hold nothing, and returns how many it removed.
func (e *Engine) PruneHolders(ctx context.Context, db store.DB, after time.Duration, limit int) (int64, error) {
	n, err := e.Store.PruneHolders(ctx, db, after, limit)
	if err != nil {
		return 0, fmt.Errorf("prune holders: %w", mapDBError(err))
	}
	return n, nil
}

// TakeLease gives the conversation to the holder (name and row) with a
// fresh epoch, if it has no live holder, and leaves its row locked until tx
// ends: the caller recovers the conversation under that lock (package
// reconcile) before it commits, counting its restarts as Taken says.
// ErrLeaseHeld when a live holder has it (or a transaction is taking it
// right now), ErrNotFound when the conversation does not exist.
func (e *Engine) TakeLease(ctx context.Context, tx pgx.Tx, conversationID, holder string, holderID int64) (Lease, Taken, error) {
	c, err := e.Store.TakeConversation(ctx, tx, conversationID, holder, holderID)
	if store.IsNoRows(err) {
		if _, gerr := e.Store.GetConversation(ctx, tx, conversationID); store.IsNoRows(gerr) {
			return Lease{}, Taken{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, arbortype.ErrNotFound)
		}
		return Lease{}, Taken{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, arbortype.ErrLeaseHeld)
	}
	if err != nil {
		return Lease{}, Taken{}, fmt.Errorf("take the lease of conversation %q: %w", conversationID, mapDBError(err))
	}
	return Lease{ConversationID: c.ID, Holder: c.Holder, HolderID: holderID, Epoch: c.Epoch},
		Taken{PrevHolder: c.PrevHolder, PrevRestarted: c.PrevRestarted}, nil
}

// Fence locks the lease's conversation if the lease still holds: a
// take-over waits for tx, or came first and tx gets ErrLeaseLost.
func (e *Engine) Fence(ctx context.Context, tx pgx.Tx, l Lease) error {
	err := e.Store.FenceConversation(ctx, tx, l.ConversationID, l.HolderID, l.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d: %w", l.ConversationID, l.Epoch, arbortype.ErrLeaseLost)
	}
	return err
}

// LockLease locks the lease's conversation for an update (a release, which
// recovers the holder's running tasks first) if the lease still holds;
// ErrLeaseLost when it does not.
func (e *Engine) LockLease(ctx context.Context, tx pgx.Tx, l Lease) error {
	_, err := e.Store.LockHeldConversation(ctx, tx, l.ConversationID, l.HolderID, l.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d: %w", l.ConversationID, l.Epoch, arbortype.ErrLeaseLost)
	}
	return err
}

// TryLockLease is LockLease that does not wait for a row lock: a
// conversation another transaction holds is ErrLeaseLost too (busy, or
// changed hands: either way not now).
func (e *Engine) TryLockLease(ctx context.Context, tx pgx.Tx, l Lease) error {
	_, err := e.Store.TryLockHeldConversation(ctx, tx, l.ConversationID, l.HolderID, l.Epoch)
	if store.IsNoRows(err) {
		return fmt.Errorf("conversation %q at epoch %d, or it is locked: %w", l.ConversationID, l.Epoch, arbortype.ErrLeaseLost)
	}
	return err
}

// ReleaseLease frees the lease's conversation. It reports whether it did
// (false: it had been taken over already).
func (e *Engine) ReleaseLease(ctx context.Context, tx pgx.Tx, l Lease) (bool, error) {
	return e.Store.ReleaseConversation(ctx, tx, l.ConversationID, l.HolderID, l.Epoch)
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
		return Task{}, errorf("start", taskID, arbortype.ErrNotFound)
	case err != nil:
		return Task{}, errorf("start", taskID, err)
	case cur.ConversationID != l.ConversationID:
		return Task{}, errorf("start", taskID, fmt.Errorf("it is in conversation %q, not %q: %w", cur.ConversationID, l.ConversationID, arbortype.ErrForeignTask))
	case cur.AbortRequested || cur.Status == arbortype.StatusAborted || cur.Status == arbortype.StatusOrphaned:
		return Task{}, errorf("start", taskID, arbortype.ErrAborted)
	case cur.Status == arbortype.StatusRunning:
		return Task{}, errorf("start", taskID, arbortype.ErrAlreadyRunning)
	case cur.Status == arbortype.StatusPending && cur.StartedAt == nil && cur.QueueExpiresAt != nil && !cur.QueueExpiresAt.After(time.Now()):
		return Task{}, errorf("start", taskID, fmt.Errorf("its time to live in the queue ended at %s: %w", cur.QueueExpiresAt.UTC().Format(time.RFC3339Nano), arbortype.ErrInvalidTransition))
	case cur.Status == arbortype.StatusPending:
		// Pending, not aborted, not expired (by the database's clock): a
		// full concurrency limit held it back (task_slots).
		return Task{}, errorf("start", taskID, arbortype.ErrConcurrencyLimit)
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
		return nil, fmt.Errorf("claim in conversation %q: limit %d is outside 1..10000: %w", l.ConversationID, p.Limit, arbortype.ErrInvalidArgument)
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
