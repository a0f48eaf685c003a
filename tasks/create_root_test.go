package tasks_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// statementCounter counts the statements a pool sends, but for the
// announcements sent after the commits (see core's announce.go).
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "pg_notify(") {
		c.n.Add(1)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// engineWith opens an engine on a fresh schema over a pool configured by
// tweak.
func engineWith(t *testing.T, tweak func(*pgxpool.Config)) (*tasks.Engine, *pgxpool.Pool) {
	t.Helper()
	_, schema := testdb.Fresh(t)
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	tweak(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	return eng, pool
}

// A root task takes one statement, whether its conversation is new or
// not: a turn per message costs one round trip. A task with an owner goes
// through a transaction.
func TestCreateRootIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	counter := &statementCounter{}
	eng, _ := engineWith(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	conv := testdb.Conversation(t)

	before := counter.n.Load()
	first, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	require.True(t, created)
	require.EqualValues(t, 1, counter.n.Load()-before, "a new conversation's first turn")

	before = counter.n.Load()
	second, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Input: []byte(`{"m": 2}`)})
	require.NoError(t, err)
	require.EqualValues(t, 1, counter.n.Load()-before, "a turn of a conversation that exists")
	require.Greater(t, second.ID, first.ID)
	require.JSONEq(t, `{"m": 2}`, string(second.Input))

	before = counter.n.Load()
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "tool", OwnerID: first.ID})
	require.NoError(t, err)
	require.Greater(t, counter.n.Load()-before, int64(1), "a child goes through a transaction")

	all, err := eng.ConversationTasks(ctx, conv)
	require.NoError(t, err)
	require.Len(t, all, 3)
	vs, err := eng.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// Many callers create the first turns of the same new conversation at
// once: the statement that loses the race for the conversation's row falls
// back to the transaction path, and every turn is created once.
func TestCreateRootRacesForANewConversation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := engineWith(t, func(*pgxpool.Config) {})
	for round := range 5 {
		conv := testdb.Conversation(t) + "-" + string(rune('a'+round))
		const n = 8
		var wg sync.WaitGroup
		ids := make(chan int64, n)
		for range n {
			wg.Go(func() {
				task, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
				if err != nil || !created {
					t.Errorf("create: created %v, %v", created, err)
					return
				}
				ids <- task.ID
			})
		}
		wg.Wait()
		close(ids)
		seen := map[int64]bool{}
		for id := range ids {
			seen[id] = true
		}
		require.Len(t, seen, n)
		all, err := eng.ConversationTasks(ctx, conv)
		require.NoError(t, err)
		require.Len(t, all, n)
	}
}

// A repeated create with the same idempotency key returns the first task,
// through the one-statement path's fallback.
func TestCreateRootIdempotencyKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := engineWith(t, func(*pgxpool.Config) {})
	conv := testdb.Conversation(t)
	p := arbortype.CreateParams{ConversationID: conv, Kind: "turn", IdempotencyKey: "msg-1"}
	first, created, err := eng.Create(ctx, p)
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := eng.Create(ctx, p)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	p.Kind = "other"
	_, _, err = eng.Create(ctx, p)
	require.ErrorIs(t, err, arbortype.ErrIdempotencyConflict)
}

// statementCutter closes its connection right after it sent a statement
// containing marker, once: the server runs (and commits) it, the client
// never hears the answer.
type statementCutter struct {
	net.Conn
	marker []byte
	armed  *atomic.Bool
}

func (c *statementCutter) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if bytes.Contains(p, c.marker) && c.armed.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
	}
	return n, err
}

// A one-statement create whose answer is lost may have committed: it is
// arbortype.ErrAmbiguous, never run again (it would make a second turn).
func TestCreateRootLostAnswerIsAmbiguous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var armed atomic.Bool
	eng, _ := engineWith(t, func(c *pgxpool.Config) {
		// The statement's text goes with every execution.
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &statementCutter{Conn: conn, marker: []byte("WITH h AS ("), armed: &armed}, nil
		}
	})
	conv := testdb.Conversation(t)
	armed.Store(true)
	_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.ErrorIs(t, err, arbortype.ErrAmbiguous)
	all, err := eng.ConversationTasks(ctx, conv)
	if !errors.Is(err, arbortype.ErrNotFound) { // the server may have seen the close first
		require.NoError(t, err)
	}
	require.LessOrEqual(t, len(all), 1, "not run twice")
}
