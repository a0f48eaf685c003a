package tasks_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// A client opens its stream before it posts the first message: Follow of a
// conversation that does not exist yet waits for it, creates nothing, and
// delivers its first entries once its first create commits.
func TestFollowBeforeTheConversationExists(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	conv := testdb.Conversation(t)

	got := make(chan arbortype.LogEntry, 16)
	done := make(chan error, 1)
	go func() {
		done <- e.Follow(ctx, conv, 0, func(en arbortype.LogEntry) error {
			got <- en
			return nil
		})
	}()
	// Following created nothing.
	_, err := e.Conversation(ctx, conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Input: json.RawMessage(`"hi"`)})
	require.NoError(t, err)
	select {
	case en := <-got:
		require.Equal(t, turn.ID, en.TaskID)
		require.Equal(t, arbortype.StatusPending, en.Status)
	case err := <-done:
		t.Fatalf("the follow ended: %v", err)
	case <-time.After(time.Minute): // the bound of a broken test, not a measure
		t.Fatal("no entry came")
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	// A malformed id is refused at once.
	err = e.Follow(t.Context(), strings.Repeat("x", 201), 0, func(arbortype.LogEntry) error { return nil })
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
}
