package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// ForkParams say what Fork copies (see tasks.ForkParams).
type ForkParams struct {
	ConversationID    string
	ThroughTurn       int64
	NewConversationID string
}

// Forked is what a fork made.
type Forked struct {
	ConversationID string
	store.ForkCounts
}

// Fork copies the settled history of p.ConversationID through turn
// p.ThroughTurn into a new conversation, in one transaction. The source
// conversation's row is locked first (docs/design.md §5), so the copy is
// of one consistent moment: a turn created or settled concurrently is
// either wholly before it or wholly after. Nothing of the source is
// written (the lock announces nothing it did not do: a runner that hears
// of it finds nothing new).
func (e *Engine) Fork(ctx context.Context, tx pgx.Tx, p ForkParams) (Forked, error) {
	if err := checkText("conversation id", p.ConversationID, true); err != nil {
		return Forked{}, fmt.Errorf("fork: %w", err)
	}
	if p.NewConversationID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return Forked{}, fmt.Errorf("fork: %w", err)
		}
		p.NewConversationID = "fork_" + hex.EncodeToString(b[:])
	}
	if err := checkText("new conversation id", p.NewConversationID, true); err != nil {
		return Forked{}, fmt.Errorf("fork: %w", err)
	}
	if p.ThroughTurn <= 0 {
		return Forked{}, fmt.Errorf("fork: turn id %d: %w", p.ThroughTurn, arbortype.ErrInvalidArgument)
	}
	what := fmt.Sprintf("fork conversation %q through turn %d", p.ConversationID, p.ThroughTurn)
	if _, err := e.Store.LockConversation(ctx, tx, p.ConversationID); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return Forked{}, fmt.Errorf("%s: %w", what, err)
	}
	turn, err := e.Store.GetTask(ctx, tx, p.ThroughTurn)
	switch {
	case store.IsNoRows(err):
		return Forked{}, fmt.Errorf("%s: no such task: %w", what, arbortype.ErrNotFound)
	case err != nil:
		return Forked{}, fmt.Errorf("%s: %w", what, err)
	case turn.ConversationID != p.ConversationID:
		return Forked{}, fmt.Errorf("%s: the task is in conversation %q: %w", what, turn.ConversationID, arbortype.ErrForeignTask)
	case turn.OwnerID != 0:
		return Forked{}, fmt.Errorf("%s: the task is a child of task %d, not a turn: %w", what, turn.OwnerID, arbortype.ErrNotRoot)
	case !turn.Status.Settled():
		return Forked{}, fmt.Errorf("%s: the turn is %s: %w", what, turn.Status, arbortype.ErrNotSettled)
	}
	ok, err := e.Store.InsertForkConversation(ctx, tx, p.NewConversationID, p.ConversationID)
	if err != nil {
		return Forked{}, fmt.Errorf("%s: %w", what, err)
	}
	if !ok {
		return Forked{}, fmt.Errorf("%s: conversation %q: %w", what, p.NewConversationID, arbortype.ErrConversationExists)
	}
	counts, err := e.Store.CopyHistory(ctx, tx, p.ConversationID, p.ThroughTurn, p.NewConversationID)
	if err != nil {
		return Forked{}, fmt.Errorf("%s: %w", what, mapDBError(err))
	}
	return Forked{ConversationID: p.NewConversationID, ForkCounts: counts}, nil
}
