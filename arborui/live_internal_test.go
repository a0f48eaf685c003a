package arborui

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestStreamsShareAFollower: the streams of one conversation share one
// follower of its log, however many; each hears every commit; the
// follower stops with the last of them.
func TestStreamsShareAFollower(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	_, _, err = engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	ws := newWatches(engine, slog.New(slog.DiscardHandler))
	var subs []*subscription
	for range 10 {
		s, err := ws.subscribe(ctx, conv)
		require.NoError(t, err)
		subs = append(subs, s)
	}
	ws.mu.Lock()
	require.Len(t, ws.m, 1)
	require.Len(t, ws.m[conv].subs, 10)
	ws.mu.Unlock()
	_, _, err = engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	for _, s := range subs {
		select {
		case <-s.news:
		case <-ctx.Done():
			t.Fatal("a subscriber heard nothing")
		}
	}
	for _, s := range subs {
		ws.unsubscribe(s)
	}
	ws.mu.Lock()
	require.Empty(t, ws.m, "the follower stopped with the last stream")
	ws.mu.Unlock()
}
