package core_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// A producer's claim in the held conversations it was told of locks only
// those with a pending task (docs/architecture.md: an ending does not
// wait behind a claim with nothing to claim): one whose only task runs is
// neither locked nor reported; one with a pending task is locked; one with
// a pending task that another transaction holds is reported as work and
// not locked (the producer tries it again); one held by another holder is
// neither.
func TestLockHeldLocksOnlyConversationsWithWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idle, work, busy, other := b.conv+"-1-idle", b.conv+"-2-work", b.conv+"-3-busy", b.conv+"-4-other"
	ids := map[string]int64{}
	for _, c := range []string{idle, work, busy, other} {
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: c, Kind: "turn"})
		require.NoError(t, err)
		ids[c] = task.ID
	}
	holder, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (int64, error) {
		h, _, err := b.engine.C.NewHolder(b.ctx, tx, "node", time.Hour)
		if err != nil {
			return 0, err
		}
		for _, c := range []string{idle, work, busy} {
			if _, _, err := b.engine.C.TakeLease(b.ctx, tx, c, "node", h); err != nil {
				return 0, err
			}
		}
		return h, nil
	})
	require.NoError(t, err)
	// The idle conversation's task runs.
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) ([]arbortype.Task, error) {
		claimed, _, err := b.engine.C.ClaimFor(b.ctx, tx, core.ClaimParamsFor{Holder: holder, Limit: 1, Conversations: []string{idle}})
		return claimed, err
	})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusRunning, b.get(t, ids[idle]).Status)

	// Another transaction holds the busy conversation's row.
	held, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(b.ctx) }()
	_, err = held.Exec(b.ctx, `SELECT 1 FROM `+b.schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE`, busy)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	got, locked, err := b.engine.C.LockHeld(b.ctx, tx, holder, []string{idle, work, busy, other})
	require.NoError(t, err)
	require.Equal(t, []string{work, busy}, got, "the conversations held with a pending task")
	require.Equal(t, []string{work}, locked, "of them, those no other transaction held")

	// From a third transaction: the idle conversation is free, the one with
	// work is locked.
	lockable := func(conv string) bool {
		probe, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = probe.Rollback(b.ctx) }()
		var n int
		require.NoError(t, probe.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT 1 FROM `+b.schema+`.conversations
			WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED) x`, conv).Scan(&n))
		return n == 1
	}
	require.True(t, lockable(idle), "a conversation with nothing pending is not locked")
	require.False(t, lockable(work), "a conversation with work is locked for the claim")
	require.NoError(t, tx.Rollback(b.ctx))
	require.NoError(t, held.Rollback(b.ctx))
}
