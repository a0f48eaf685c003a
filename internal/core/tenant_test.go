package core_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
)

// A conversation's tenant is set by the create that makes it, taken by
// every later create that names none, refused to one that names another
// (nothing written), never changed by hand, and carried by a fork.
func TestTenantIsSetOnceAndCarried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, "acme", first.Tenant)
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, "acme", conv.Tenant)

	child, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: first.ID, Kind: "tool"})
	require.NoError(t, err)
	require.Equal(t, "acme", child.Tenant, "a create naming no tenant takes its conversation's")
	many, _, err := b.engine.CreateMany(b.ctx, []arbortype.CreateParams{{ConversationID: b.conv, OwnerID: first.ID, Kind: "tool"}})
	require.NoError(t, err)
	require.Equal(t, "acme", many[0].Tenant)

	before := b.snapshot(t)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Tenant: "other"})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = b.engine.CreateMany(b.ctx, []arbortype.CreateParams{{ConversationID: b.conv, Kind: "turn", Tenant: "other"}})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = b.engine.CreateMany(b.ctx, []arbortype.CreateParams{
		{ConversationID: b.conv + "-new", Kind: "turn", Tenant: "a"}, {ConversationID: b.conv + "-new", Kind: "turn", Tenant: "b"}})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	require.Equal(t, before, b.snapshot(t), "nothing written")

	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.conversations SET tenant = 'other' WHERE id = $1`, b.conv)
	requireGuard(t, err, "a conversation's tenant changed by hand")
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET tenant = 'other' WHERE id = $1`, first.ID)
	require.Error(t, err, "a task's tenant changed by hand")

	// A fork's conversation is its source's tenant, and so are its tasks.
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	forked, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: first.ID})
	require.NoError(t, err)
	fc, err := b.engine.Conversation(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Equal(t, "acme", fc.Tenant)
	copied, err := b.engine.ConversationTasks(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.NotEmpty(t, copied)
	for _, c := range copied {
		require.Equal(t, "acme", c.Tenant)
	}
}

// node is a holder row for a test acting as a runner.
func node(t *testing.T, b *bundle, ttl time.Duration) int64 {
	t.Helper()
	h, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (int64, error) {
		id, _, err := b.engine.C.NewHolder(b.ctx, tx, "node", ttl)
		return id, err
	})
	require.NoError(t, err)
	return h
}

// open opens up to limit conversations for holder h, as a runner's scan
// does, and returns them in id order.
func open(t *testing.T, b *bundle, h int64, limit int, busy store.Busy) []string {
	t.Helper()
	o, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.Opened, error) {
		return b.engine.C.OpenConversations(b.ctx, tx, "node", h, nil, limit, nil, nil, busy)
	})
	require.NoError(t, err)
	var out []string
	for _, l := range o.Leases {
		out = append(out, l.ConversationID)
	}
	return out
}

// turns creates n one-task conversations of tenant, named prefix-01…, in
// one batch (they share a creation time), or one by one.
func turns(t *testing.T, b *bundle, tenant, prefix string, n int, p arbortype.CreateParams) []string {
	t.Helper()
	var ids []string
	for i := range n {
		c := fmt.Sprintf("%s-%02d", prefix, i+1)
		p := p
		p.ConversationID, p.Kind, p.Tenant = c, "turn", tenant
		_, _, err := b.engine.Create(b.ctx, p)
		require.NoError(t, err)
		ids = append(ids, c)
	}
	return ids
}

// The open shares a runner's workers among tenants by weight, from its runs
// in flight (design.md §3.15): a tenant's one turn is not queued behind
// another's backlog, and a tenant of weight 3 gets three places where one
// of weight 1 gets one.
func TestOpenSharesRunnersAmongTenants(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	a := turns(t, b, "a", "a", 8, arbortype.CreateParams{})
	bb := turns(t, b, "b", "b", 1, arbortype.CreateParams{})
	h := node(t, b, time.Hour)

	// B's one turn is newer than all of A's, and is taken with A's oldest.
	require.Equal(t, []string{a[0], bb[0]}, open(t, b, h, 2, store.Busy{}))

	// A runner busy with A's work takes B's next turn first.
	more := turns(t, b, "b", "b2", 2, arbortype.CreateParams{})
	require.Equal(t, []string{more[0]}, open(t, b, h, 1, store.Busy{Tenants: []string{"a"}, Runs: []int32{2}}))

	// Weighted: A of weight 3 and B of weight 1, each with one run in
	// flight: A's next three come at 1/3, 2/3 and 1, B's next at 1 (after
	// A's third, older).
	require.NoError(t, b.engine.SetTenantWeight(b.ctx, "a", 3))
	got := open(t, b, h, 4, store.Busy{Tenants: []string{"a", "b"}, Runs: []int32{1, 1}})
	require.Equal(t, []string{a[1], a[2], a[3], more[1]}, got)
}

// A claim across held conversations shares its places the same way.
func TestClaimSharesPlacesAmongTenants(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	a := turns(t, b, "a", "a", 5, arbortype.CreateParams{})
	bb := turns(t, b, "b", "b", 1, arbortype.CreateParams{})
	h := node(t, b, time.Hour)
	require.Len(t, open(t, b, h, 0+6, store.Busy{Tenants: []string{"x"}, Runs: []int32{0}}), 0+6)
	// The open claims nothing itself (the runner claims in its transaction):
	// the claim across every held conversation, two places.
	claimed, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) ([]arbortype.Task, error) {
		c, _, err := b.engine.C.ClaimFor(b.ctx, tx, core.ClaimParamsFor{Holder: h, Limit: 2})
		return c, err
	})
	require.NoError(t, err)
	var convs []string
	for _, c := range claimed {
		convs = append(convs, c.ConversationID)
	}
	require.ElementsMatch(t, []string{a[0], bb[0]}, convs)
}

// A task of priority p queues as if created p seconds earlier: an
// interactive turn goes before an older background backlog, and a
// background task is passed only by work created less than the difference
// of priorities after it (aging).
func TestPriorityQueuesWithAging(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	bg := turns(t, b, "", "bg", 3, arbortype.CreateParams{Priority: -10})
	hot := turns(t, b, "", "hot", 1, arbortype.CreateParams{Priority: 60})
	h := node(t, b, time.Hour)
	require.Equal(t, hot, open(t, b, h, 1, store.Busy{}))

	var lag float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT extract(epoch FROM created_at - queue_at) FROM `+b.schema+`.tasks
		WHERE conversation_id = $1`, bg[0]).Scan(&lag))
	require.InDelta(t, -10, lag, 1e-6, "queued at created_at less its priority in seconds")

	// A priority outside -3600..3600 is refused, nothing written.
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: "x", Kind: "turn", Priority: 3601})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.Conversation(b.ctx, "x")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
}

// startIn starts task id under holder h's lease of its conversation, taking
// the lease first.
func startIn(b *bundle, h int64, conv string, id int64) (arbortype.Task, error) {
	return core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (arbortype.Task, error) {
		l, taken, err := b.engine.C.TakeLease(b.ctx, tx, conv, "node", h)
		if err != nil {
			return arbortype.Task{}, err
		}
		if _, err := recovery.OnOpen(b.ctx, b.engine.C, tx, conv, taken.Counted()); err != nil {
			return arbortype.Task{}, err
		}
		return b.engine.C.Start(b.ctx, tx, l, id)
	})
}

func limitOf(t *testing.T, b *bundle, key string) arbortype.ConcurrencyLimit {
	t.Helper()
	ls, err := b.engine.ConcurrencyLimits(b.ctx)
	require.NoError(t, err)
	for _, l := range ls {
		if l.Key == key {
			return l
		}
	}
	t.Fatalf("no limit %s", key)
	return arbortype.ConcurrencyLimit{}
}

// A limit of 2, three runners racing to start ten tasks of its key: two
// start, the others are held back (ErrConcurrencyLimit, still pending);
// each end of a run frees one slot for one more start.
func TestConcurrencyLimitUnderRacingRunners(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	const key = "key:search"
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, key, 2))
	type job struct {
		conv string
		id   int64
	}
	var jobs []job
	for i := range 10 {
		c := fmt.Sprintf("c-%02d", i)
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: c, Kind: "tool", ConcurrencyKey: "search"})
		require.NoError(t, err)
		jobs = append(jobs, job{c, task.ID})
	}
	var (
		mu      sync.Mutex
		started []arbortype.Task
		held    int
		wg      sync.WaitGroup
		gate    = make(chan struct{})
	)
	for r := range 3 {
		h := node(t, b, time.Hour)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for i := r; i < len(jobs); i += 3 {
				task, err := startIn(b, h, jobs[i].conv, jobs[i].id)
				mu.Lock()
				switch {
				case err == nil:
					started = append(started, task)
				case errors.Is(err, arbortype.ErrConcurrencyLimit):
					held++
				default:
					t.Errorf("start %d: %v", jobs[i].id, err)
				}
				mu.Unlock()
			}
		}()
	}
	close(gate)
	wg.Wait()
	require.Len(t, started, 2, "never more than the limit")
	require.Equal(t, 8, held)
	require.Equal(t, 2, limitOf(t, b, key).Running)
	for _, j := range jobs {
		if j.id != started[0].ID && j.id != started[1].ID {
			require.Equal(t, arbortype.StatusPending, b.get(t, j.id).Status)
		}
	}

	// One run ends: its slot goes back in that transaction.
	_, err := b.engine.Complete(b.ctx, started[0].ID, started[0].Token, js(`"ok"`))
	require.NoError(t, err)
	require.Equal(t, 1, limitOf(t, b, key).Running)
	var next job
	for _, j := range jobs {
		if b.get(t, j.id).Status == arbortype.StatusPending {
			next = j
			break
		}
	}
	h := node(t, b, time.Hour)
	_, err = startIn(b, h, next.conv, next.id)
	require.NoError(t, err)
	require.Equal(t, 2, limitOf(t, b, key).Running)
}

// A node that dies holds its slots while its runs stay running; the
// take-over's recovery gives them back in its transaction.
func TestDeadNodesSlotsAreGivenBackAtTakeOver(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "tenant:acme", 1))
	one, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: "one", Kind: "turn", Tenant: "acme"})
	require.NoError(t, err)
	two, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: "two", Kind: "turn", Tenant: "acme"})
	require.NoError(t, err)

	dying := node(t, b, 50*time.Millisecond)
	_, err = startIn(b, dying, "one", one.ID)
	require.NoError(t, err)
	require.Equal(t, 1, limitOf(t, b, "tenant:acme").Running)
	other := node(t, b, time.Hour)
	_, err = startIn(b, other, "two", two.ID)
	require.ErrorIs(t, err, arbortype.ErrConcurrencyLimit)

	// The dying node's row expires (by the database's clock); it never
	// renews: another node takes its conversation over.
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at < now() FROM `+b.schema+`.holders WHERE id = $1`, dying).Scan(&expired))
		return expired
	}, time.Minute, 10*time.Millisecond)
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (bool, error) {
		_, taken, err := b.engine.C.TakeLease(b.ctx, tx, "one", "node", other)
		if err != nil {
			return false, err
		}
		_, err = recovery.OnOpen(b.ctx, b.engine.C, tx, "one", taken.Counted())
		return true, err
	})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, b.get(t, one.ID).Status, "requeued by the take-over")
	require.Equal(t, 0, limitOf(t, b, "tenant:acme").Running, "its slot given back with it")
	_, err = startIn(b, other, "two", two.ID)
	require.NoError(t, err)
}

// A limit set while runs of its key are under way counts them.
func TestNewLimitCountsRunsUnderWay(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	h := node(t, b, time.Hour)
	var run []arbortype.Task
	for i := range 3 {
		c := fmt.Sprintf("k-%d", i)
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: c, Kind: "tool"})
		require.NoError(t, err)
		if i < 2 {
			started, err := startIn(b, h, c, task.ID)
			require.NoError(t, err)
			run = append(run, started)
		}
	}
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:tool", 2))
	require.Equal(t, 2, limitOf(t, b, "kind:tool").Running)
	third, err := b.engine.ConversationTasks(b.ctx, "k-2")
	require.NoError(t, err)
	_, err = startIn(b, h, "k-2", third[0].ID)
	require.ErrorIs(t, err, arbortype.ErrConcurrencyLimit)
	for _, r := range run {
		_, err := b.engine.Complete(b.ctx, r.ID, r.Token, nil)
		require.NoError(t, err)
	}
	require.Equal(t, 0, limitOf(t, b, "kind:tool").Running)
	_, err = startIn(b, h, "k-2", third[0].ID)
	require.NoError(t, err)

	// Bad keys and maxima are refused, nothing written.
	for _, key := range []string{"", "search", "kind:", "key:", "tenants:x"} {
		require.ErrorIs(t, b.engine.SetConcurrencyLimit(b.ctx, key, 1), arbortype.ErrInvalidArgument, key)
	}
	require.ErrorIs(t, b.engine.SetConcurrencyLimit(b.ctx, "key:x", -1), arbortype.ErrInvalidArgument)
	require.ErrorIs(t, b.engine.DeleteConcurrencyLimit(b.ctx, "key:nothing"), arbortype.ErrNotFound)
	require.ErrorIs(t, b.engine.SetTenantWeight(b.ctx, "a", 0), arbortype.ErrInvalidArgument)
	ls, err := b.engine.ConcurrencyLimits(b.ctx)
	require.NoError(t, err)
	require.Len(t, ls, 1)
}

// A turn queued behind a live one with a time to live is never started
// past it, and the sweep cancels it with code expired.
func TestQueuedTurnExpires(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	live, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	b.start(t, live.ID)
	queued, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", QueueTTL: time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, queued.QueueExpiresAt)
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT queue_expires_at <= now() FROM `+b.schema+`.tasks WHERE id = $1`, queued.ID).Scan(&expired))
		return expired
	}, time.Minute, 5*time.Millisecond)

	// The live turn ends; the queued one would be next, but expired.
	_, err = b.engine.Complete(b.ctx, live.ID, b.get(t, live.ID).Token, nil)
	require.NoError(t, err)
	claimed, err := b.engine.Claim(b.ctx, b.conv, 10)
	require.NoError(t, err)
	require.Empty(t, claimed, "no claim starts a task past its time to live")
	_, err = b.engine.Start(b.ctx, queued.ID)
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)

	n, err := b.engine.C.ExpireQueued(b.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := b.get(t, queued.ID)
	require.Equal(t, arbortype.StatusCancelled, got.Status)
	require.Equal(t, arbortype.CodeExpired, got.Error.Code)
	require.Nil(t, got.StartedAt, "it never started")
	n, err = b.engine.C.ExpireQueued(b.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n)
}

// The checker (invariant 13) finds a limit whose count is not its runs'.
func TestCheckerCountsSlots(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:tool", 5))
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "tool"})
	require.NoError(t, err)
	b.start(t, task.ID)
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Empty(t, vs)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.concurrency_limits SET running = 3`)
	require.NoError(t, err)
	vs, err = b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	require.Equal(t, 13, vs[0].Invariant)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.concurrency_limits SET running = 1`)
	require.NoError(t, err)
}
