package main

import (
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

func TestLs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "no conversation has live work\n", b.arbor(t, "ls").ok(t).stdout)

	// conv-a: a waiting turn with a running and a pending child, held by a
	// machine. conv-b: everything settled. conv-c: one pending task.
	b.conv = "conv-a"
	turn := b.start(t, b.create(t, 0, "turn", false).ID)
	tool := b.create(t, turn.ID, "tool", false)
	b.start(t, tool.ID)
	other := b.create(t, turn.ID, "tool", false)
	_, err := b.engine.WaitForChildren(b.ctx, turn.ID, turn.Token, tasksWait(tool.ID, other.ID))
	require.NoError(t, err)
	// Name the holder and its deadline as a runner's node would have them.
	b.setHolder(t, "conv-a", "node-7", "2030-01-02T03:04:05Z")

	b.conv = "conv-b"
	done := b.start(t, b.create(t, 0, "turn", false).ID)
	_, err = b.engine.Complete(b.ctx, done.ID, done.Token, nil)
	require.NoError(t, err)

	b.conv = "conv-c"
	b.create(t, 0, "turn", false)

	require.Equal(t, `CONVERSATION  LIVE  PENDING  RUNNING  WAITING  SLEEPING  AWAITING  COMPLETING  HOLDER  LEASE DEADLINE
conv-a        3     1        1        1        0         0         0           node-7  2030-01-02T03:04:05Z
conv-c        1     1        0        0        0         0         0           -       -
`, b.arbor(t, "ls").ok(t).stdout)

	// --status keeps conversations with a live task in one of the statuses.
	require.Equal(t, `CONVERSATION  LIVE  PENDING  RUNNING  WAITING  SLEEPING  AWAITING  COMPLETING  HOLDER  LEASE DEADLINE
conv-a        3     1        1        1        0         0         0           node-7  2030-01-02T03:04:05Z
`, b.arbor(t, "ls", "--status", "waiting").ok(t).stdout)
	require.Equal(t, "no conversation has live work\n", b.arbor(t, "ls", "--status", "sleeping,completing").ok(t).stdout)
	b.arbor(t, "ls", "--status", "completed").fails(t, 1, `ls: --status "completed": give live statuses`)

	// --limit cuts the list and says so.
	require.Equal(t, `CONVERSATION  LIVE  PENDING  RUNNING  WAITING  SLEEPING  AWAITING  COMPLETING  HOLDER  LEASE DEADLINE
conv-a        3     1        1        1        0         0         0           node-7  2030-01-02T03:04:05Z
(only the first 1; raise --limit, or 0 for all)
`, b.arbor(t, "ls", "--limit", "1").ok(t).stdout)

	var entries []struct {
		ID     string         `json:"id"`
		Holder string         `json:"holder"`
		Epoch  int64          `json:"epoch"`
		Live   map[string]int `json:"live"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "ls", "--json").ok(t).stdout), &entries))
	require.Len(t, entries, 2)
	require.Equal(t, "conv-a", entries[0].ID)
	require.Equal(t, "node-7", entries[0].Holder)
	require.Equal(t, int64(2), entries[0].Epoch)
	require.Equal(t, map[string]int{"pending": 1, "running": 1, "waiting": 1}, entries[0].Live)
	require.Equal(t, map[string]int{"pending": 1}, entries[1].Live)
}

func tasksWait(ids ...int64) core.WaitParams {
	return core.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "waiting"}
}

// setHolder gives conversation conv to a new holder row named holder whose
// lease ends at until, as a runner's take-over would: a new epoch. A
// deadline as far off as the tests want to print (years) is one no holder
// of arbor's has (a lease is at most a day), and the guard refuses it: it
// is written with the triggers off, as a superuser's hand-edit would.
func (b *bundle) setHolder(t *testing.T, conv, holder, until string) {
	t.Helper()
	s := pgx.Identifier{b.schema}.Sanitize()
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `WITH h AS (INSERT INTO `+s+`.holders (name, expires_at) VALUES ($2, $3::timestamptz) RETURNING id)
			UPDATE `+s+`.conversations SET holder = $2, holder_id = (SELECT id FROM h), epoch = epoch + 1 WHERE id = $1`, conv, holder, until)
		return err
	})
	require.NoError(t, err)
}
