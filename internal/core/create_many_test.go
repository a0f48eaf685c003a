package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
)

func TestCreateMany(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := testdb.Conversation(t)
	root := b.root(t, "turn")
	b.start(t, root.ID)
	prior, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool", IdempotencyKey: "k1"})
	require.NoError(t, err)

	ps := []arbortype.CreateParams{
		{ConversationID: other, Kind: "turn", Input: []byte(`{"n": 0}`)},
		{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool", IdempotencyKey: "k1"}, // exists already
		{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool", IdempotencyKey: "k2"},
		{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool", IdempotencyKey: "k2"}, // repeated in the batch
		{ConversationID: b.conv, OwnerID: root.ID, Kind: "summary", Background: true, MaxRetries: 3},
		{ConversationID: other, Kind: "turn", Input: []byte(`{"n": 5}`)},
	}
	got, created, err := b.engine.CreateMany(b.ctx, ps)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, true, false, true, true}, created)
	require.Equal(t, prior.ID, got[1].ID)
	require.Equal(t, got[2].ID, got[3].ID, "a key repeated in the batch is created once")
	require.Less(t, got[0].ID, got[2].ID, "ids grow in the order given")
	require.Less(t, got[4].ID, got[5].ID)
	for i, task := range got {
		stored := b.get(t, task.ID)
		require.Equal(t, stored.ConversationID, task.ConversationID, "task %d", i)
		require.Equal(t, stored.Kind, task.Kind)
		require.Equal(t, stored.OwnerID, task.OwnerID)
		require.Equal(t, stored.Background, task.Background)
		require.Equal(t, stored.MaxRetries, task.MaxRetries)
		require.Equal(t, stored.RestartLimit, task.RestartLimit)
		require.Equal(t, arbortype.StatusPending, task.Status)
		require.Equal(t, stored.CreatedAt, task.CreatedAt)
		if len(ps[i].Input) > 0 {
			require.JSONEq(t, string(ps[i].Input), string(task.Input))
		}
	}
	for _, c := range []string{b.conv, other} {
		_, err := b.engine.AbortConversation(b.ctx, c)
		require.NoError(t, err)
		vs, err := b.engine.Check(b.ctx, c)
		require.NoError(t, err)
		require.Empty(t, vs)
	}
}

// TestCreateManyRefusesTheBatch: one bad task refuses all of them, and
// nothing is written, not even the conversations.
func TestCreateManyRefusesTheBatch(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	b := newBundle(t, pool, schema)
	root := b.root(t, "turn")
	done := reach(t, b, arbortype.StatusCompleted, false).task
	fresh := testdb.Conversation(t)
	check := untouched(t, pool, schema)
	for name, bad := range map[string]arbortype.CreateParams{
		"unknown owner":            {ConversationID: b.conv, OwnerID: 1 << 40, Kind: "k"},
		"owner of another conv":    {ConversationID: fresh, OwnerID: root.ID, Kind: "k"},
		"settled owner":            {ConversationID: b.conv, OwnerID: done.ID, Kind: "k"},
		"empty kind":               {ConversationID: fresh},
		"bad JSON":                 {ConversationID: fresh, Kind: "k", Input: []byte(`{`)},
		"key of another kind":      {ConversationID: b.conv, OwnerID: root.ID, Kind: "other", IdempotencyKey: "dup"},
		"arbor's own key prefix":   {ConversationID: fresh, Kind: "k", IdempotencyKey: "arbor:x"},
		"background root":          {ConversationID: fresh, Kind: "k", Background: true},
		"restart limit over int32": {ConversationID: fresh, Kind: "k", RestartLimit: 1 << 31},
	} {
		ps := []arbortype.CreateParams{
			{ConversationID: fresh, Kind: "fine"},
			{ConversationID: b.conv, OwnerID: root.ID, Kind: "tool", IdempotencyKey: "dup"},
			bad,
		}
		_, _, err := b.engine.CreateMany(b.ctx, ps)
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "task 2 of 3", name)
		check(name)
	}
	_, _, err := b.engine.CreateMany(b.ctx, make([]arbortype.CreateParams, 10_001))
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// TestCreateManyLocksAConversationCreatedMeanwhile: CreateMany inserts the
// new conversations of its batch without locking them (no other
// transaction can see them before it ends) and locks the others; a
// conversation another transaction created after CreateMany's statement
// began — its insert skips it, its lock cannot see it — is locked all the
// same before any task is inserted in it.
func TestCreateManyLocksAConversationCreatedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	conv, fresh := testdb.Conversation(t), testdb.Conversation(t)
	const app = "arbor-test-create-many-meanwhile"

	other, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `INSERT INTO `+b.schema+`.conversations (id) VALUES ($1)`, conv)
	require.NoError(t, err)

	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET application_name = '`+app+`'`)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	done := make(chan error, 1)
	go func() {
		_, _, err := b.engine.CreateManyTx(ctx, tx, []arbortype.CreateParams{
			{ConversationID: conv, Kind: "turn"},
			{ConversationID: fresh, Kind: "turn"},
		})
		done <- err
	}()
	// The batch's insert waits for the other transaction's row of conv.
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		return err == nil && n == 1
	}, time.Minute, 5*time.Millisecond)
	require.NoError(t, other.Commit(ctx))
	require.NoError(t, <-done)

	// conv is locked by the batch until it ends; fresh, its own insert,
	// no other transaction sees until then.
	probe, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = probe.Rollback(ctx) }()
	_, err = probe.Exec(ctx, `SELECT 1 FROM `+b.schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE NOWAIT`, conv)
	require.Error(t, err, "conversation %s is locked by the batch", conv)
	require.NoError(t, probe.Rollback(ctx))
	var seen int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.schema+`.conversations WHERE id = $1`, fresh).Scan(&seen))
	require.Zero(t, seen, "the batch's own conversation is not seen before it commits")
	require.NoError(t, tx.Commit(ctx))
	for _, c := range []string{conv, fresh} {
		_, err := b.engine.AbortConversation(ctx, c)
		require.NoError(t, err)
	}
}
