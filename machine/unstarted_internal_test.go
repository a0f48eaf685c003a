package machine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestUnstartedRunIsRequeuedNotAbandoned: a run this node claimed and
// never handed to a handler is requeued by the node's own recovery, not
// abandoned, though its task is abandon_on_restart: no handler saw the
// run, so it cannot have made its side effect. The task then runs once,
// and completes, with no restart counted. Two ways a run goes unstarted:
//
//   - claimed while its conversation is lapsed: a flush whose transaction
//     was on its way when the fence fired (a chaos run saw one commit
//     through a database restart); dispatch does not start it;
//   - past the fence point when its handler would start: the lease's
//     clock passed it between dispatch and start, and the fence's own
//     goroutine has not fired yet; start's check of the context fires it
//     (outside Runner.mu, which the fence takes) and does not call the
//     handler.
//
// The test holds Runner.claimMu for writing, so that neither the producer
// nor the reopen claims the task first, and claims it as a flush does
// (ClaimFor with the runner's claim parameters).
func TestUnstartedRunIsRequeuedNotAbandoned(t *testing.T) {
	t.Parallel()
	for name, atStart := range map[string]bool{"claimed while lapsed": false, "past the fence point at its start": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requeuedNotAbandoned(t, atStart)
		})
	}
}

func requeuedNotAbandoned(t *testing.T, atStart bool) {
	ctx := context.Background()
	var calls atomic.Int32
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) },
		"once": func(ctx context.Context, run *Run) error {
			calls.Add(1)
			return run.Complete(ctx, []byte(`"done"`))
		},
	}
	ir := startInternalRunner(t, handlers, func(c *RunnerConfig) {
		c.IdleRelease = time.Minute // the conversation stays held while idle
	})
	r, eng, conv := ir.r, ir.eng, ir.conv
	status := func(id int64) arbortype.Status {
		got, err := eng.Get(ctx, id)
		require.NoError(t, err)
		return got.Status
	}

	// The node holds the conversation, idle.
	ir.holdIdle(t)

	// No claim, reopen or flush of the runner's from here.
	r.claimMu.Lock()
	locked := true
	defer func() {
		if locked {
			r.claimMu.Unlock()
		}
	}()
	var (
		stall pgx.Tx
		err   error
	)
	if atStart {
		// Renewals stall on the node's holder row, so that nothing moves
		// the lease's clock but the test.
		holder, _ := r.lease.holder()
		stall, err = ir.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = stall.Rollback(context.Background()) }()
		_, err = stall.Exec(ctx, `SELECT 1 FROM `+ir.schema+`.holders WHERE id = $1 FOR UPDATE`, holder)
		require.NoError(t, err)
	} else {
		r.lease.fire()
		r.mu.Lock()
		_, lapsed := r.lapsed[conv]
		r.mu.Unlock()
		require.True(t, lapsed, "the fence marked the conversation lapsed")
	}

	once, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "once", AbandonOnRestart: true})
	require.NoError(t, err)
	var claimed []arbortype.Task
	_, err = core.Tx(ctx, r.core, func(tx pgx.Tx) (struct{}, error) {
		p := r.claimParams(1)
		p.Conversations = []string{conv}
		var err error
		claimed, _, err = r.core.ClaimFor(ctx, tx, p)
		return struct{}{}, err
	})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "the claim took the task: its holder row is live, only the node's own clock fences it")
	require.Equal(t, once.ID, claimed[0].ID)
	token := claimed[0].Token
	if atStart {
		// What dispatch does for a run it starts, while the lease is usable.
		r.mu.Lock()
		r.busy++
		a := r.newActive(claimed[0])
		r.liveIn[conv]++
		r.runs[once.ID] = a
		r.handlerWG.Add(1)
		r.mu.Unlock()
		// Then the clock passes the fence point before the handler starts.
		r.lease.confirmed.Store(r.lease.since(time.Now()))
		r.start(a)
		waitFor(t, "the run to end without its handler", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.runs[once.ID] == nil
		})
		require.True(t, r.lease.fired.Load(), "start's check fired the fence")
		require.NoError(t, stall.Rollback(ctx))
	} else {
		// Its slot, as a flush reserves one; dispatch gives it back when
		// it does not start the run.
		r.mu.Lock()
		r.busy++
		r.mu.Unlock()
		r.dispatch(claimed)
	}
	require.Zero(t, calls.Load(), "no handler saw the run")
	require.True(t, r.uncalled(token), "the run stays unstarted")
	require.Equal(t, arbortype.StatusRunning, status(once.ID))

	r.claimMu.Unlock()
	locked = false
	waitFor(t, "the once task to settle", func() bool {
		s := status(once.ID)
		return s != arbortype.StatusRunning && s != arbortype.StatusPending
	})
	got, err := eng.Get(ctx, once.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, got.Status, "requeued and run, not abandoned (error %+v)", got.Error)
	require.JSONEq(t, `"done"`, string(got.Result))
	require.Equal(t, int32(1), calls.Load(), "its handler ran once")
	require.Zero(t, got.Attempt, "no restart counted")
	vs, err := eng.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs, "invariant violations")
}
