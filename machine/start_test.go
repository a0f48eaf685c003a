package machine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// TestACreateStartsItsTask (docs/design.md §3.18): a root created in a
// new conversation by the process whose runner runs its kind is inserted
// running, its conversation taken by the runner at epoch 1, and its
// handler entered once — no open, no claim — while the cases a create may
// not start (a conversation that exists, a concurrency key, an
// AbandonOnRestart task, a kind the runner does not run, a stopped runner)
// are inserted pending and run as ever.
func TestACreateStartsItsTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := b.conv
	var entered atomic.Int32
	done := func(ctx context.Context, run *machine.Run) error {
		entered.Add(1)
		return run.Complete(ctx, nil)
	}
	r := fastRunner(t, b, map[string]machine.Handler{"turn": done}, func(c *machine.RunnerConfig) {
		c.IdleRelease = time.Hour // the conversations stay held: their epochs are read below
		c.OnReconcile = func(rep reconcile.Report) {
			if !rep.Empty() {
				t.Errorf("something to recover in a new conversation: %+v", rep)
			}
		}
	})

	// A create is started by its statement only while the runner has a
	// worker it has not reserved for a claim of its own (its passes reserve
	// them all for a moment): one that was not is created pending, and
	// claimed; the next conversation is tried.
	var task arbortype.Task
	var made []int64
	for i := 0; i < 20 && task.Status != arbortype.StatusRunning; i++ {
		b.conv = fmt.Sprintf("%s-%d", base, i)
		var created bool
		var err error
		task, created, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
		require.NoError(t, err)
		require.True(t, created)
		made = append(made, task.ID)
	}
	require.Equal(t, arbortype.StatusRunning, task.Status, "started by its create")
	require.EqualValues(t, 1, task.Epoch)
	require.NotZero(t, task.Token)
	waitUntil(t, "the turns to complete", func() bool {
		for _, id := range made {
			if b.get(t, id).Status != arbortype.StatusCompleted {
				return false
			}
		}
		return true
	})
	require.EqualValues(t, len(made), entered.Load(), "each handler entered once")
	require.Zero(t, b.get(t, task.ID).Attempt)
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, r.NodeID(), conv.Holder)
	require.EqualValues(t, 1, conv.Epoch)
	entries, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	var statuses []arbortype.Status
	for _, e := range entries {
		if e.TaskID == task.ID && e.Kind == arbortype.LogKindStatus {
			statuses = append(statuses, e.Status)
		}
	}
	require.Equal(t, []arbortype.Status{arbortype.StatusRunning, arbortype.StatusCompleted}, statuses, "never pending")

	// What a create does not start: pending, then claimed or opened.
	pending := []arbortype.CreateParams{
		{ConversationID: b.conv, Kind: "turn"}, // its conversation exists
		{ConversationID: base + "-key", Kind: "turn", ConcurrencyKey: "k-" + base},
		{ConversationID: base + "-abandon", Kind: "turn", AbandonOnRestart: true},
	}
	var ids []int64
	for _, p := range pending {
		task, _, err := b.engine.Create(b.ctx, p)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusPending, task.Status, "%+v", p)
		ids = append(ids, task.ID)
	}
	other, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: base + "-other", Kind: "unrun"})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, other.Status, "a kind the runner does not run")
	waitUntil(t, "the pending turns to complete", func() bool {
		for _, id := range ids {
			if b.get(t, id).Status != arbortype.StatusCompleted {
				return false
			}
		}
		return true
	})
	require.EqualValues(t, len(made)+len(ids), entered.Load())

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(ctx))
	late, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: base + "-late", Kind: "turn"})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, late.Status, "a stopped runner starts nothing")
	_, err = b.engine.Cancel(b.ctx, late.ID, nil)
	require.NoError(t, err)
	_, err = b.engine.Cancel(b.ctx, other.ID, nil)
	require.NoError(t, err)
}

// TestACreateWhoseAnswerIsLostRunsOnce: the statement of a create that
// started its task commits, and its answer is lost (the connection dies
// once the server has answered, before the client reads it). The caller gets ErrAmbiguous; the runner
// finds the run it was granted (an adopt) and enters it once, with the
// create's token: no restart counted, no second run.
func TestACreateWhoseAnswerIsLostRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var entered atomic.Int32
	engine, armed := cutRunner(t, b, "WITH h AS (", map[string]machine.Handler{
		"pay": func(ctx context.Context, run *machine.Run) error {
			entered.Add(1)
			return run.Complete(ctx, nil)
		},
	})
	var err error

	// A create is started by its statement only while the runner has a
	// worker it has not reserved for a claim of its own (its first pass
	// after Start reserves them all for a moment): one that was not is
	// created pending and claimed, and the cut is tried again.
	folded := false
	for i := 0; i < 20 && !folded; i++ {
		conv := fmt.Sprintf("%s-%d", b.conv, i)
		before := entered.Load()
		armed.Store(true)
		_, _, err = engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "pay"})
		require.ErrorIs(t, err, arbortype.ErrAmbiguous)
		require.False(t, armed.Load(), "the answer was cut")
		var all []arbortype.Task
		waitUntil(t, "the payment to be made", func() bool {
			all, err = b.engine.ConversationTasks(b.ctx, conv)
			require.NoError(t, err, "the statement committed")
			return len(all) == 1 && all[0].Status == arbortype.StatusCompleted
		})
		require.Zero(t, all[0].Attempt, "no restart counted")
		require.Equal(t, before+1, entered.Load(), "entered once")
		entries, err := b.engine.ReadLog(b.ctx, conv, 0, 100)
		require.NoError(t, err)
		var statuses []arbortype.Status
		for _, e := range entries {
			if e.Kind == arbortype.LogKindStatus {
				statuses = append(statuses, e.Status)
			}
		}
		if statuses[0] == arbortype.StatusPending {
			require.Equal(t, []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusCompleted}, statuses)
			continue
		}
		require.Equal(t, []arbortype.Status{arbortype.StatusRunning, arbortype.StatusCompleted}, statuses,
			"adopted with the create's run, not requeued and claimed again")
		folded = true
	}
	require.True(t, folded, "a create started its task")
	b.requireClean(t)
}

// cutRunner starts a runner with handlers on an engine of its own whose
// connections answerCutter watches for marker (armed: cut the next
// answer), its statements sent as text; the runner stops at the test's
// end.
func cutRunner(t *testing.T, b *bundle, marker string, handlers map[string]machine.Handler) (*tasks.Engine, *atomic.Bool) {
	t.Helper()
	armed := &atomic.Bool{}
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // the statement's text goes with it
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &answerCutter{Conn: conn, marker: []byte(marker), armed: armed}, nil
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	engine, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	r, err := machine.NewRunner(engine, handlers, &machine.RunnerConfig{ConversationLease: 5 * time.Second,
		PollInterval: 50 * time.Millisecond, IdleRelease: time.Hour, ShutdownGrace: 2 * time.Second,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	return engine, armed
}

// answerCutter drops its connection once the server has answered a
// statement containing marker with ReadyForQuery (so the statement has
// committed), before the client reads the answer, once.
type answerCutter struct {
	net.Conn
	marker  []byte
	armed   *atomic.Bool
	pending bool
}

// readyForQuery is the server's ReadyForQuery message, idle.
var readyForQuery = []byte("Z\x00\x00\x00\x05I")

func (c *answerCutter) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.marker) && c.armed.Load() {
		c.pending = true
	}
	return c.Conn.Write(p)
}

func (c *answerCutter) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.pending && bytes.Contains(p[:n], readyForQuery) && c.armed.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

// TestCreateManyStartsTheFirstTasksOfNewConversations: CreateMany in a
// process whose runner has workers free starts the first task of each new
// conversation of the batch (docs/design.md §3.18); a conversation's next
// task, a task of a conversation that exists and one with a concurrency
// key are created pending; all run, each once.
func TestCreateManyStartsTheFirstTasksOfNewConversations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var entered atomic.Int32
	fastRunner(t, b, map[string]machine.Handler{"turn": func(ctx context.Context, run *machine.Run) error {
		entered.Add(1)
		return run.Complete(ctx, nil)
	}}, nil)
	existing := b.conv + "-existing"
	_, _, err := b.engine.CreateMany(b.ctx, []arbortype.CreateParams{{ConversationID: existing, Kind: "turn"}})
	require.NoError(t, err)
	var all []int64
	started := false
	// A batch made while the runner's claim held its workers is queued
	// whole: the next batch is tried.
	for i := 0; i < 20 && !started; i++ {
		conv := func(s string) string { return fmt.Sprintf("%s-%d-%s", b.conv, i, s) }
		ps := []arbortype.CreateParams{
			{ConversationID: conv("a"), Kind: "turn"}, {ConversationID: conv("a"), Kind: "turn"},
			{ConversationID: conv("b"), Kind: "turn"},
			{ConversationID: existing, Kind: "turn"},
			{ConversationID: conv("key"), Kind: "turn", ConcurrencyKey: "k-" + b.conv},
			{ConversationID: conv("b"), Kind: "turn"},
		}
		made, _, err := b.engine.CreateMany(b.ctx, ps)
		require.NoError(t, err)
		var statuses []arbortype.Status
		for _, m := range made {
			statuses = append(statuses, m.Status)
			all = append(all, m.ID)
		}
		if made[0].Status == arbortype.StatusPending {
			require.Equal(t, []arbortype.Status{"pending", "pending", "pending", "pending", "pending", "pending"}, statuses)
			continue
		}
		started = true
		require.Equal(t, []arbortype.Status{"running", "pending", "running", "pending", "pending", "pending"}, statuses)
		for _, m := range []arbortype.Task{made[0], made[2]} {
			require.EqualValues(t, 1, m.Epoch)
			require.NotZero(t, m.Token)
			require.NotNil(t, m.StartedAt)
			require.NotNil(t, m.LeaseExpiresAt)
			got := b.get(t, m.ID)
			require.Equal(t, m.Token, got.Token, "the token it returned is the run's")
		}
	}
	require.True(t, started, "a batch started its tasks")
	waitUntil(t, "every task to complete", func() bool {
		for _, id := range all {
			if b.get(t, id).Status != arbortype.StatusCompleted {
				return false
			}
		}
		return true
	})
	require.EqualValues(t, len(all)+1, entered.Load(), "each entered once")
	for _, id := range all {
		require.Zero(t, b.get(t, id).Attempt)
	}
}
