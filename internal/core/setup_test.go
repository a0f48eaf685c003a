package core_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	engine *enginetest.Engine
	conv   string
	// retries is the MaxRetries of the tasks root() creates, deadline
	// their Deadline.
	retries  int
	deadline time.Time
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool, schema := testdb.Shared(t)
	return newBundle(t, pool, schema)
}

// setupTruncating is setup on a schema of the test's own, for a test that
// tries a TRUNCATE. A TRUNCATE (the guard refuses it, but only once its
// locks are taken) locks every table it would empty, the cascade's
// included, exclusively and in its own order: holders, conversations, then
// the tables under them, the reverse of every transaction that locks a
// conversation and then reads a holder. On the schema the package's tests
// share, it deadlocked with their work, and was the one refused with
// 40P01 (TestGuardRefusesForgedHolders, on a busy machine).
func setupTruncating(t testing.TB) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	return newBundle(t, pool, schema)
}

func newBundle(t testing.TB, pool *pgxpool.Pool, schema string) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{ctx: ctx, pool: pool, schema: schema, conv: testdb.Conversation(t),
		engine: enginetest.New(t, pool, &tasks.Config{Schema: schema})}
	t.Cleanup(func() { b.requireInvariants(t) })
	return b
}

func (b *bundle) requireInvariants(t testing.TB) {
	t.Helper()
	if _, err := b.engine.Conversation(context.Background(), b.conv); err != nil {
		return // the test never created it
	}
	vs, err := b.engine.Check(context.Background(), b.conv)
	require.NoError(t, err)
	require.Empty(t, vs, "invariant violations")
}

func (b *bundle) root(t testing.TB, kind string) arbortype.Task {
	t.Helper()
	task, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: kind, MaxRetries: b.retries, Deadline: b.deadline})
	require.NoError(t, err)
	require.True(t, created)
	return task
}

func (b *bundle) child(t testing.TB, owner int64, kind string) arbortype.Task {
	t.Helper()
	task, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: owner, Kind: kind})
	require.NoError(t, err)
	require.True(t, created)
	return task
}

func (b *bundle) background(t testing.TB, owner int64, kind string) arbortype.Task {
	t.Helper()
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: owner, Kind: kind, Background: true})
	require.NoError(t, err)
	return task
}

// lease returns the test's lease on its conversation (which must exist),
// taking it on first use.
func (b *bundle) lease(t testing.TB) core.Lease {
	t.Helper()
	l, err := b.engine.Lease(b.ctx, b.conv)
	require.NoError(t, err)
	return l
}

func (b *bundle) start(t testing.TB, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Start(b.ctx, id)
	require.NoError(t, err)
	return task
}

func (b *bundle) get(t testing.TB, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Get(b.ctx, id)
	require.NoError(t, err)
	return task
}

// snapshot returns every row of the conversation, and the conversation row,
// as JSON text: two equal snapshots mean nothing was written.
func (b *bundle) snapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT json_agg(t ORDER BY id)::text FROM `+b.schema+`.tasks t WHERE conversation_id = $1), '')
		|| coalesce((SELECT row_to_json(c)::text FROM `+b.schema+`.conversations c WHERE id = $1), '')`, b.conv).Scan(&s)
	require.NoError(t, err)
	return s
}

func js(s string) json.RawMessage { return json.RawMessage(s) }
