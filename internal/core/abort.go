package core

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// AbortReport says what an abort settled.
type AbortReport struct {
	// Settled are the tasks the abort settled, as it wrote them (status,
	// settle_seq, settled_at, the reason as error), leaves first (the order
	// their settles were recorded in); the target, when it was live, is
	// last.
	Settled []Task
}

// Abort aborts taskID with every live foreground descendant (docs/design.md
// §3.6), leaves first, the target last, then reconciles the target's owner.
func (e *Engine) Abort(ctx context.Context, tx pgx.Tx, taskID int64) (AbortReport, error) {
	return e.AbortWhy(ctx, tx, taskID, "")
}

// AbortWhy is Abort recording reason (when not empty) as the target's
// error, code "aborted": what arbor show and the log say of the abort.
func (e *Engine) AbortWhy(ctx context.Context, tx pgx.Tx, taskID int64, reason string) (AbortReport, error) {
	why, err := abortReason(reason)
	if err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	if t.Status.Settled() {
		return AbortReport{}, errorf("abort", taskID, transitionError(taskID, t.Status, fsm.Abort))
	}
	settled, err := e.abortSubtreesWhy(ctx, tx, t.ConversationID, []int64{taskID}, why)
	if err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	rep := AbortReport{Settled: settled}
	target := rep.Settled[len(rep.Settled)-1]
	if err := e.reconcileOwner(ctx, tx, target); err != nil {
		return AbortReport{}, errorf("abort", taskID, err)
	}
	return rep, nil
}

// AbortConversation aborts every live task of a conversation, background
// tasks included, leaves first.
func (e *Engine) AbortConversation(ctx context.Context, tx pgx.Tx, conversationID string) (AbortReport, error) {
	return e.AbortConversationWhy(ctx, tx, conversationID, "")
}

// AbortConversationWhy is AbortConversation recording reason (when not
// empty) on the conversation's live roots.
func (e *Engine) AbortConversationWhy(ctx context.Context, tx pgx.Tx, conversationID, reason string) (AbortReport, error) {
	why, err := abortReason(reason)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation: %w", err)
	}
	if err := checkText("conversation id", conversationID, true); err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation: %w", err)
	}
	if _, err := e.Store.LockConversation(ctx, tx, conversationID); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	ids, err := e.Store.LiveConversationTaskIDs(ctx, tx, conversationID)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	nodes, err := e.lockLive(ctx, tx, conversationID, ids)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	var roots []int64
	for _, n := range nodes {
		if n.OwnerID == 0 {
			roots = append(roots, n.ID)
		}
	}
	settled, err := e.abortLockedWhy(ctx, tx, conversationID, nodes, roots, why)
	if err != nil {
		return AbortReport{}, fmt.Errorf("abort conversation %q: %w", conversationID, err)
	}
	return AbortReport{Settled: settled}, nil
}

// abortReason is the error an abort with reason records (nil for none).
func abortReason(reason string) (*TaskError, error) {
	if reason == "" {
		return nil, nil
	}
	if err := checkText("abort reason", reason, false); err != nil {
		return nil, err
	}
	return &TaskError{Code: arbortype.CodeAborted, Message: reason}, nil
}

// AbortTurnWhy aborts the live turn of a conversation — its oldest live
// root task: the turn under way, or, none started yet, the next to run —
// with its foreground subtree, as Abort does (the user pressed stop): its
// background tasks and the turns queued behind it are left alone. No live
// turn is an empty report (a stop pressed twice is no error); an unknown
// conversation ErrNotFound.
func (e *Engine) AbortTurnWhy(ctx context.Context, tx pgx.Tx, conversationID, reason string) (AbortReport, error) {
	what := fmt.Sprintf("abort the live turn of conversation %q", conversationID)
	if err := checkText("conversation id", conversationID, true); err != nil {
		return AbortReport{}, fmt.Errorf("%s: %w", what, err)
	}
	why, err := abortReason(reason)
	if err != nil {
		return AbortReport{}, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := e.Store.LockConversation(ctx, tx, conversationID); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return AbortReport{}, fmt.Errorf("%s: %w", what, err)
	}
	roots, err := e.Store.LiveRoots(ctx, tx, conversationID)
	if err != nil || len(roots) == 0 {
		return AbortReport{}, err
	}
	settled, err := e.abortSubtreesWhy(ctx, tx, conversationID, []int64{roots[0].ID}, why)
	if err != nil {
		return AbortReport{}, fmt.Errorf("%s: %w", what, err)
	}
	return AbortReport{Settled: settled}, nil
}
