package tasks_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// RecentConversations lists the conversations of the newest tasks, most
// recent first, each once, with its tenant, up to its limit; a limit
// outside 1..1000 is refused.
func TestRecentConversations(t *testing.T) {
	t.Parallel()
	engine, _ := engineWith(t, func(*pgxpool.Config) {})
	ctx := t.Context()
	tenants := map[string]string{"c1": "acme", "c2": "", "c3": "globex"}
	for _, conv := range []string{"c1", "c2", "c3", "c1"} { // c1 again: its newest task counts
		_, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Tenant: tenants[conv]})
		require.NoError(t, err)
	}
	got, err := engine.RecentConversations(ctx, 10)
	require.NoError(t, err)
	var ids []string
	for _, c := range got {
		ids = append(ids, c.ID)
		require.Equal(t, tenants[c.ID], c.Tenant, c.ID)
	}
	require.Equal(t, []string{"c1", "c3", "c2"}, ids)

	got, err = engine.RecentConversations(ctx, 2)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "c1", got[0].ID)

	for _, limit := range []int{0, -1, 1001} {
		_, err := engine.RecentConversations(ctx, limit)
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, fmt.Sprint(limit))
	}
}
