package tasks

import (
	"context"
	"fmt"
)

// Violation is one breach of the invariants of docs/design.md §4 found by
// Check.
type Violation struct {
	// Invariant is the number of the invariant in docs/design.md §4 (1–13);
	// 0 for a consistency rule of the engine's own (its Message says which).
	Invariant      int
	ConversationID string
	TaskID         int64
	Message        string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d: conversation %q task %d: %s", v.Invariant, v.ConversationID, v.TaskID, v.Message)
}

// Check runs the invariant checker over the given conversations, or over
// every conversation of the schema when none is given, and returns every
// violation it finds (none: an empty slice), ordered by conversation and
// task. Each conversation is read in one repeatable-read snapshot, so Check
// can run while the conversation is busy. docs/design.md §4 lists what is
// checked. An unknown conversation is arbortype.ErrNotFound. It has no …Tx form: it
// reads in snapshots of its own.
func (e *Engine) Check(ctx context.Context, conversationIDs ...string) ([]Violation, error) {
	vs, err := e.core.Check(ctx, conversationIDs...)
	if err != nil {
		return nil, err
	}
	out := make([]Violation, len(vs))
	for i, v := range vs {
		out[i] = Violation(v)
	}
	return out, nil
}
