package machine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// maintenanceTicks counts, by runner, the maintenance ticks each led (ran
// the schema's scans) and each followed, from the runners' test hook, and
// signals every count.
type maintenanceTicks struct {
	mu       sync.Mutex
	led      []int
	followed []int
	// onLead, when set, is called (under mu) by runner i's first tick that
	// leads after it was set.
	onLead func(i int)
	signal chan struct{}
}

func (m *maintenanceTicks) hook(i int) func(led bool) {
	return func(led bool) {
		m.mu.Lock()
		if led {
			m.led[i]++
			if m.onLead != nil {
				m.onLead(i)
				m.onLead = nil
			}
		} else {
			m.followed[i]++
		}
		m.mu.Unlock()
		select {
		case m.signal <- struct{}{}:
		default:
		}
	}
}

// snapshot returns the counts so far.
func (m *maintenanceTicks) snapshot() (led, followed []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int(nil), m.led...), append([]int(nil), m.followed...)
}

// waitUntil waits, on the hooks' signals, until cond holds of the counts.
func (m *maintenanceTicks) waitUntil(t *testing.T, what string, cond func(led, followed []int) bool) {
	t.Helper()
	bound := time.NewTimer(eventually)
	defer bound.Stop()
	for {
		if cond(m.snapshot()) {
			return
		}
		select {
		case <-m.signal:
		case <-bound.C:
			led, followed := m.snapshot()
			t.Fatalf("timed out waiting for %s (ticks led %v, followed %v)", what, led, followed)
		}
	}
}

// ticked says that every runner in who ticked at least n times more than
// in since.
func ticked(n int, since []int, who ...int) func(led, followed []int) bool {
	return func(led, followed []int) bool {
		for _, i := range who {
			if led[i]+followed[i]-since[i] < n {
				return false
			}
		}
		return true
	}
}

func sum(a, b []int) []int {
	out := make([]int, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// leadersSince returns the runners that led a tick since the counts led0.
func leadersSince(led, led0 []int) []int {
	var out []int
	for i := range led {
		if led[i] > led0[i] {
			out = append(out, i)
		}
	}
	return out
}

var errKilled = errors.New("killed by the test")

// Three runners on one schema: at each tick one of them, the leader, runs
// the schema's scans, and the others none; when the leader stops, another
// takes over; when that one dies (its loops gone, its holder row left to
// expire), the last takes over, and only once the dead leader's holder row
// has expired.
func TestMaintenanceRunsOnOneLeader(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ticks := &maintenanceTicks{led: make([]int, 3), followed: make([]int, 3), signal: make(chan struct{}, 1)}
	runners := make([]*Runner, 3)
	for i := range runners {
		r, err := NewRunner(eng.Engine, map[string]Handler{"turn": func(context.Context, *Run) error { return nil }}, &RunnerConfig{
			NodeID:            "node-" + string(rune('a'+i)),
			ConversationLease: 3 * time.Second,
			PollInterval:      20 * time.Millisecond,
			ShutdownGrace:     time.Second,
			Logger:            slog.New(slog.DiscardHandler),
			Waker:             &WakerConfig{RiverTestOnly: true},
		})
		require.NoError(t, err)
		r.testMaintained = ticks.hook(i)
		runners[i] = r
	}
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { require.NoError(t, r.Start(context.Background())) })
	}
	wg.Wait()
	for _, r := range runners {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, r.Stop(ctx))
		})
	}

	// Started together, each ticks ten times: one of them led, and it
	// alone.
	zero := make([]int, 3)
	ticks.waitUntil(t, "ten ticks of each runner", ticked(10, zero, 0, 1, 2))
	led, _ := ticks.snapshot()
	leaders := leadersSince(led, zero)
	require.Len(t, leaders, 1, "the runners that ran the schema's scans (ticks led %v)", led)
	first := leaders[0]

	// The leader stops (its holder row removed): one of the other two takes
	// over, and it alone.
	require.NoError(t, runners[first].Stop(context.Background()))
	others := []int{(first + 1) % 3, (first + 2) % 3}
	led0, _ := ticks.snapshot()
	ticks.waitUntil(t, "a runner to lead after the leader stopped", func(led, _ []int) bool { return len(leadersSince(led, led0)) > 0 })
	led1, followed1 := ticks.snapshot()
	ticks.waitUntil(t, "ten more ticks of each running runner", ticked(10, sum(led1, followed1), others...))
	led, _ = ticks.snapshot()
	leaders = leadersSince(led, led0)
	require.Len(t, leaders, 1, "the runners that led since the first leader stopped (ticks led %v, before %v)", led, led0)
	second := leaders[0]
	last := others[0]
	if last == second {
		last = others[1]
	}

	// The second leader dies: its loops end (no renewal, no maintenance,
	// no Stop), and its holder row stays until it expires. The last runner
	// takes over, and finds the dead leader's row expired when it first
	// leads.
	dead := runners[second]
	deadHolder, _ := dead.lease.holder()
	expiredAtTakeOver := make(chan bool, 1)
	ticks.mu.Lock()
	ticks.onLead = func(i int) {
		var expired bool
		err := pool.QueryRow(context.Background(), `SELECT expires_at < now() FROM `+schema+`.holders WHERE id = $1`, deadHolder).Scan(&expired)
		expiredAtTakeOver <- err == nil && expired && i == last
	}
	ticks.mu.Unlock()
	dead.cancelRun(errKilled)
	dead.loops.Wait()
	led0, _ = ticks.snapshot()
	ticks.waitUntil(t, "the last runner to lead after the leader died", func(led, _ []int) bool { return led[last] > led0[last] })
	require.True(t, <-expiredAtTakeOver, "the last runner led only once the dead leader's holder row had expired")
	led1, followed1 = ticks.snapshot()
	ticks.waitUntil(t, "ten more ticks of the last runner", ticked(10, sum(led1, followed1), last))
	led2, _ := ticks.snapshot()
	require.Equal(t, led1[second], led2[second], "the dead leader ran no scan")
	require.Greater(t, led2[last], led1[last], "the last runner leads")
}

// A runner whose lease is not usable (its fence fired: the database out
// of reach, the process frozen) does not lead, though the leader's row
// names it and its holder row is live: another runner may lead as soon as
// that row expires.
func TestMaintenanceLeaderStepsDownWhenItsFenceFires(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	l := newNodeLease(eng.C, "node-a", 20*time.Second, slog.New(slog.DiscardHandler))
	l.onFire, l.onConfirm = func() {}, func(bool) {}
	require.NoError(t, l.begin(context.Background()))
	m := &maintainer{core: eng.C, logger: slog.New(slog.DiscardHandler), lease: l}

	ctx, cancel, led := m.lead(context.Background())
	require.True(t, led, "the first runner to look leads")
	deadline, ok := ctx.Deadline()
	require.True(t, ok, "a scan runs under the lease's fence point")
	until, _ := l.usableUntil(time.Now())
	require.Equal(t, until, deadline)
	cancel()

	l.fire()
	_, _, led = m.lead(context.Background())
	require.False(t, led, "a runner whose fence fired does not lead")
	holder, live, err := eng.C.Store.Leader(context.Background(), eng.C.Pool)
	require.NoError(t, err)
	id, _ := l.holder()
	require.Equal(t, id, holder)
	require.True(t, live)

	// Another life cannot take the leadership from a live holder row.
	other := newNodeLease(eng.C, "node-b", 20*time.Second, slog.New(slog.DiscardHandler))
	other.onFire, other.onConfirm = func() {}, func(bool) {}
	require.NoError(t, other.begin(context.Background()))
	_, _, led = (&maintainer{core: eng.C, logger: slog.New(slog.DiscardHandler), lease: other}).lead(context.Background())
	require.False(t, led, "no second leader while the first one's holder row is live")
}

// Two elections at once take turns on the leader's row: the second waits
// for the first's lock, then sees its election and its holder row, even a
// holder row committed after the second began (its check's snapshot is
// taken after the lock, not before it), and does not take the row.
func TestMaintenanceLeaderElectionsTakeTurns(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := context.Background()
	st := eng.C.Store
	b, _, err := st.NewHolder(ctx, pool, "node-b", time.Minute)
	require.NoError(t, err)

	// The row exists (a schema recycled between tests has none: an
	// election makes it); A's election holds its lock; B's waits for it.
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.maintenance_leader (holder_id) VALUES (NULL) ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(ctx) }()
	_, err = txA.Exec(ctx, `SELECT 1 FROM `+schema+`.maintenance_leader FOR UPDATE`)
	require.NoError(t, err)
	type result struct {
		won bool
		err error
	}
	bDone := make(chan result, 1)
	go func() {
		won, err := core.Tx(ctx, eng.C, func(tx pgx.Tx) (bool, error) { return st.ElectLeader(ctx, tx, b) })
		bDone <- result{won, err}
	}()
	waitFor(t, "B's election to wait for the row's lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%.maintenance_leader%'`, schema).Scan(&n))
		return n == 1
	})
	// A's holder row is committed after B's election began, and A takes
	// the row.
	a, _, err := st.NewHolder(ctx, pool, "node-a", time.Minute)
	require.NoError(t, err)
	_, err = txA.Exec(ctx, `UPDATE `+schema+`.maintenance_leader SET holder_id = $1`, a)
	require.NoError(t, err)
	require.NoError(t, txA.Commit(ctx))

	got := <-bDone
	require.NoError(t, got.err)
	require.False(t, got.won, "B's election saw A's")
	leader, live, err := st.Leader(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, a, leader)
	require.True(t, live)
}
