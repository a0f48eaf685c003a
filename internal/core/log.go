package core

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Progress appends a progress entry to the conversation's log for the
// running task held with token. It locks the conversation (the log's order
// is its commit order) without announcing it to the runners: the caller
// announces it to the log's followers after the commit (AnnounceLog).
func (e *Engine) Progress(ctx context.Context, tx pgx.Tx, taskID, token int64, name string, payload json.RawMessage) (int64, string, error) {
	if err := checkText("progress name", name, false); err != nil {
		return 0, "", errorf("progress", taskID, err)
	}
	if err := e.checkPayload("progress payload", payload); err != nil {
		return 0, "", errorf("progress", taskID, err)
	}
	if err := e.Store.LockConversationOfTaskQuiet(ctx, tx, taskID); err != nil {
		if store.IsNoRows(err) {
			err = arbortype.ErrNotFound
		}
		return 0, "", errorf("progress", taskID, err)
	}
	t, err := e.Store.GetTask(ctx, tx, taskID)
	if err != nil {
		return 0, "", errorf("progress", taskID, err)
	}
	if err := checkHolder(t, token); err != nil {
		return 0, "", errorf("progress", taskID, err)
	}
	seq, err := e.Store.AppendLog(ctx, tx, t.ConversationID, taskID, arbortype.LogKindProgress, name, payload)
	if err != nil {
		return 0, "", errorf("progress", taskID, mapDBError(err))
	}
	return seq, t.ConversationID, nil
}

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
