package chaos

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// envBigAbortChildren sets the fan-out of TestBigAbortOnABusyNode
// (default 100,000).
const envBigAbortChildren = "ARBOR_CHAOS_ABORT_CHILDREN"

// TestBigAbortOnABusyNode (i, issue 38): the owner of 100,000 children
// aborted with the engine's defaults (IdleInTransaction 5 s) while two
// runners run the workload beside a CPU hog of four busy loops per core,
// right after the fan-out, on statistics taken before it (autovacuum off
// on the schema's tables). Before, such an abort sat idle between two of
// its statements for longer than the engine's limit on every try (it read
// every task of the subtree whole at once, and built a state machine per
// task), and failed with ErrUnavailable or ran for minutes. It must
// complete, every child settled before its owner and the owner last, with
// nothing else lost: the workload's proof holds beside it. The fan-out's
// conversation is held by a Lease of the test's, so that no runner claims
// its tasks (the owner is left pending: a start by the test would be one
// by no runner's process, which the proof refuses).
func TestBigAbortOnABusyNode(t *testing.T) {
	s := setup(t, 60)
	children := 100_000
	if v := os.Getenv(envBigAbortChildren); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, envBigAbortChildren)
		children = n
	}
	for _, table := range []string{"tasks", "conversation_log", "conversations", "events"} {
		s.Exec(`ALTER TABLE {s}.` + table + ` SET (autovacuum_enabled = false)`)
	}
	s.Exec(`ANALYZE {s}.tasks, {s}.conversation_log`)

	const conv = "chaos-big-abort"
	root, _, err := s.Engine.Create(s.Ctx, arbortype.CreateParams{ConversationID: conv, Kind: "big-owner"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(s.Ctx, s.Engine, conv, &machine.LeaseConfig{Holder: "chaos-big-abort", Duration: 30 * time.Minute})
	require.NoError(t, err)
	// The fan-out in batches, each on a pool of its own: a session
	// caches the plans of the guards' PL/pgSQL statements the first time
	// it runs them, and one that first ran them on a table of a few pages
	// (the workload's) keeps a sequential scan for the owner's lookup,
	// which a 10,000-row insert then runs once per row (seen here: 10,000
	// children took minutes; autovacuum, off here, would have refreshed
	// the plans with its statistics). Not what this scenario measures.
	began := time.Now()
	for done, batch := 0, 1_000; done < children; done, batch = done+batch, 10_000 {
		pool := testdb.NewPool(t)
		engine, err := tasks.New(s.Ctx, pool, &tasks.Config{Schema: s.Schema})
		require.NoError(t, err)
		ps := make([]arbortype.CreateParams, min(batch, children-done))
		for i := range ps {
			ps[i] = arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "big-child"}
		}
		_, _, err = engine.CreateMany(s.Ctx, ps)
		require.NoError(t, err)
		pool.Close()
	}
	fanOut := time.Since(began)
	t.Logf("(i) fan-out of %d children: %s", children, fanOut.Round(100*time.Millisecond))

	threads := 4 * runtime.NumCPU()
	stopHog := s.startHog(threads)
	a := s.startChild("i-a", leaseDefault)
	b := s.startChild("i-b", leaseDefault)
	s.WaitProgress(s.Runs(), 20)
	require.False(t, s.Done(), "the workload was done before the abort")
	var load string
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = string(raw[:min(len(raw), 14)])
	}

	began = time.Now()
	rep, err := s.Engine.Abort(s.Ctx, root.ID, tasks.WithReason("the user pressed stop"))
	took := time.Since(began)
	require.NoError(t, err, "the abort of %d children", children)
	stopHog()
	t.Logf("(i) fan-out of %d children in %s; abort of %d tasks beside 2 runners and a CPU hog of %d busy threads on %d cores (load %s): %s",
		children, fanOut.Round(100*time.Millisecond), len(rep.Settled), threads, runtime.NumCPU(), load, took.Round(100*time.Millisecond))
	require.Len(t, rep.Settled, children+1)
	require.Equal(t, root.ID, rep.Settled[len(rep.Settled)-1].ID, "the owner settles last")

	live := s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id = $1
		AND status IN ('pending','running','waiting','sleeping','completing')`, conv)
	orphaned := s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id = $1 AND status = 'orphaned'`, conv)
	after := s.Count(`SELECT count(*) FROM {s}.tasks c WHERE c.conversation_id = $1 AND c.owner_task_id IS NOT NULL
		AND c.settle_seq > (SELECT settle_seq FROM {s}.tasks WHERE id = $2)`, conv, root.ID)
	logged := s.Count(`SELECT count(*) FROM {s}.conversation_log WHERE conversation_id = $1 AND kind = 'status'
		AND status IN ('aborted', 'orphaned')`, conv)
	require.Zero(t, live, "nothing of the conversation is live")
	require.Equal(t, children+1, orphaned, "every task, never started, orphaned")
	require.Zero(t, after, "every child settled before its owner")
	require.Equal(t, children+1, logged, "every settle logged")
	vs, err := s.Engine.Check(s.Ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs, "the invariants of the aborted conversation")
	require.NoError(t, lease.Release(context.Background()))

	s.WaitSettled()
	s.stop(a)
	s.stop(b)
	s.Verify()
}
