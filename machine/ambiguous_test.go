package machine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// commitCutter is a client connection that closes itself right after it
// sent the COMMIT of a transaction that ran a statement containing marker,
// once over all its pool's connections: the server reads the COMMIT and
// commits, the client never hears the answer.
type commitCutter struct {
	net.Conn
	marker   []byte
	armed    *atomic.Bool
	cut      chan struct{}
	claiming bool
}

// commitMessage is pgx's COMMIT: a simple query message.
var commitMessage = []byte("Q\x00\x00\x00\x0bcommit\x00")

func (c *commitCutter) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.marker) {
		c.claiming = true
	}
	n, err := c.Conn.Write(p)
	if bytes.Contains(p, commitMessage) {
		if c.claiming && c.armed.CompareAndSwap(true, false) {
			_ = c.Conn.Close()
			close(c.cut)
		}
		c.claiming = false
	}
	return n, err
}

// TestAmbiguousClaimRunsWhatItClaimed: the commit of a runner's
// transaction is answered by nobody (the connection dies once COMMIT is
// sent), though it committed — an open (lease, recovery and claim in one
// transaction), a claim in a conversation the runner holds, and a
// completer's flush (which settled one task and claimed the next turn).
// What the transaction claimed then runs under the runner's lease with no
// handler: the runner must find it and run it, with the claim's token — not
// claim again over it (it would find nothing), and not leave it for a
// recovery that would count a restart that never happened, or settle an
// abandon_on_restart task as abandoned though it never ran. The flushed
// handler's Complete returns nil: it landed.
func TestAmbiguousClaimRunsWhatItClaimed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		marker        string // a fragment of the statement whose transaction is cut
		before, after int    // tasks created before the runner starts, and once it holds the conversation
	}{
		{"open", "epoch = c.epoch + 1", 1, 0},
		{"claim in a held conversation", "FOR NO KEY UPDATE OF t, c SKIP LOCKED", 1, 1},
		{"flush", "pg_current_xact_id()::text::bigint FROM", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ambiguousClaim(t, tc.marker, tc.before, tc.after)
		})
	}
}

func ambiguousClaim(t *testing.T, marker string, before, after int) {
	b := setup(t)
	var armed atomic.Bool
	armed.Store(after == 0)
	cut := make(chan struct{})
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	// Every statement's text goes with it (no cached prepared statements),
	// so that the cutter sees which statement a transaction ran.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commitCutter{Conn: conn, marker: []byte(marker), armed: &armed, cut: cut}, nil
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	engine, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)

	var ids []int64
	create := func() {
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "pay", AbandonOnRestart: true})
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	for range before {
		create()
	}
	var runs atomic.Int32
	completes := make(chan error, before+after)
	r, err := machine.NewRunner(engine, map[string]machine.Handler{
		"pay": func(ctx context.Context, run *machine.Run) error {
			runs.Add(1)
			err := run.Complete(ctx, json.RawMessage(`"paid"`))
			completes <- err
			return err
		},
	}, &machine.RunnerConfig{
		// Long enough that a starved renewer does not fire the fence: a
		// fence stops the adopted run and abandons its abandon_on_restart
		// task, at-most-once working as designed, which is not what this
		// test is about (with 1 s, a second `make test` beside fired it).
		ConversationLease: 5 * time.Second,
		PollInterval:      50 * time.Millisecond,
		IdleRelease:       time.Minute,
		ShutdownGrace:     2 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	if after > 0 {
		waitUntil(t, "the first tasks to settle", func() bool { return b.liveTasks(t) == 0 })
		require.Equal(t, []string{b.conv}, r.Held())
		armed.Store(true)
		for range after {
			create()
		}
	}
	select {
	case <-cut:
	case <-time.After(eventually):
		require.FailNow(t, "no transaction was cut")
	}
	waitUntil(t, "every task to settle", func() bool { return b.liveTasks(t) == 0 })
	for _, id := range ids {
		got := b.get(t, id)
		require.Equal(t, arbortype.StatusCompleted, got.Status, "task %d ran (error %+v)", id, got.Error)
		require.Zero(t, got.Attempt, "task %d was not recovered: no restart happened", id)
	}
	require.EqualValues(t, len(ids), runs.Load(), "each task ran once")
	for range ids {
		require.NoError(t, <-completes, "every Complete landed and says so")
	}
	b.requireClean(t)
}
