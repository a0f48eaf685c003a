package core

import (
	"context"
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// ReadLog reads up to limit entries of a conversation's log after seq
// after, in order. An unknown conversation is ErrNotFound.
func (e *Engine) ReadLog(ctx context.Context, db store.DB, conv string, after int64, limit int) ([]store.LogEntry, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	if after < 0 || limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("read log of %q: after %d, limit %d (1..10000): %w", conv, after, limit, arbortype.ErrInvalidArgument)
	}
	entries, err := e.Store.ReadLog(ctx, db, conv, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read log of %q: %w", conv, err)
	}
	if len(entries) == 0 {
		// Nothing after the cursor: of a conversation, or of none (a
		// follower of a conversation that does not exist would wait for
		// ever).
		if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
			if store.IsNoRows(err) {
				err = arbortype.ErrNotFound
			}
			return nil, fmt.Errorf("read log of %q: %w", conv, err)
		}
	}
	return entries, nil
}
