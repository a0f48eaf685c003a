package machine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// commitCutter is a client connection that closes itself right after it
// sent the COMMIT of a transaction that claimed tasks, once over all its
// pool's connections: the server reads the COMMIT and commits, the client
// never hears the answer.
type commitCutter struct {
	net.Conn
	armed    *atomic.Bool
	cut      chan struct{}
	claiming bool
}

// commitMessage is pgx's COMMIT: a simple query message.
var commitMessage = []byte("Q\x00\x00\x00\x0bcommit\x00")

func (c *commitCutter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("WITH picked AS")) { // the claim (the statement is parsed on first use)
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

// TestAmbiguousClaimRunsWhatItClaimed: the commit of a runner's claim is
// answered by nobody (the connection dies once COMMIT is sent), though it
// committed. The claimed task then runs under the runner's lease with no
// handler: the runner must find it and run it, with the claim's token — not
// claim again over it (it would find nothing), and not leave it for a
// recovery that would count a restart that never happened, or settle an
// abandon_on_restart task as abandoned though it never ran.
func TestAmbiguousClaimRunsWhatItClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var armed atomic.Bool
	armed.Store(true)
	cut := make(chan struct{})
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commitCutter{Conn: conn, armed: &armed, cut: cut}, nil
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	engine, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)

	task, _, err := b.engine.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, Kind: "pay", AbandonOnRestart: true})
	require.NoError(t, err)
	var runs atomic.Int32
	r, err := machine.NewRunner(engine, map[string]machine.Handler{
		"pay": func(ctx context.Context, run *machine.Run) error {
			runs.Add(1)
			return run.Complete(ctx, json.RawMessage(`"paid"`))
		},
	}, &machine.RunnerConfig{
		ConversationLease: time.Second,
		PollInterval:      50 * time.Millisecond,
		IdleRelease:       200 * time.Millisecond,
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
	select {
	case <-cut:
	case <-time.After(eventually):
		require.FailNow(t, "no claim was committed")
	}
	waitUntil(t, "the task to settle", func() bool { return b.status(t, task.ID).Settled() })
	got := b.get(t, task.ID)
	require.Equal(t, arbortype.StatusCompleted, got.Status, "the claimed task ran (error %+v)", got.Error)
	require.Zero(t, got.Attempt, "it was not recovered: no restart happened")
	require.EqualValues(t, 1, runs.Load())
	b.requireClean(t)
}
