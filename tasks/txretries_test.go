package tasks_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Config.TxRetries can say "no retries" (issue 38: 0 became the default 5,
// and a negative value was refused): TxRetriesNone (-1) is kept as it is by
// WithDefaults, accepted by New and reported by Config; 0 is the default;
// below -1 or above 100 is refused, naming the field.
func TestTxRetriesNoneMeansNoRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Shared(t)
	require.Equal(t, tasks.TxRetriesDefault, (&tasks.Config{}).WithDefaults().TxRetries)
	require.Equal(t, tasks.TxRetriesNone, (&tasks.Config{TxRetries: tasks.TxRetriesNone}).WithDefaults().TxRetries)

	eng, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TxRetries: tasks.TxRetriesNone})
	require.NoError(t, err)
	require.Equal(t, -1, eng.Config().TxRetries)
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: testdb.Conversation(t), Kind: "turn"})
	require.NoError(t, err, "an engine that retries nothing works")

	for _, bad := range []int{-2, 101} {
		_, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TxRetries: bad})
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%d", bad)
		require.ErrorContains(t, err, "Config.TxRetries")
	}
}
