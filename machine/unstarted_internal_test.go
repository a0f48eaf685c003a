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
	"github.com/arborhq/arbor/tasks"
)

// TestUnstartedRunIsRequeuedNotAbandoned: a run claimed by this node
// while its conversation is lapsed — a flush whose transaction was on its
// way when the fence fired (a chaos run saw one commit through a database
// restart) — is never handed to a handler. The reopen that re-validates
// the conversation once the lease is confirmed must requeue it, not
// abandon it: its task is abandon_on_restart, but no handler saw the run,
// so it cannot have made its side effect. The task then runs once, and
// completes, with no restart counted.
//
// The test holds Runner.claimMu for writing, so that the reopen waits,
// fires the fence itself, and claims the task as a flush does (ClaimFor
// with the runner's claim parameters, then dispatch) while the
// conversation is lapsed.
func TestUnstartedRunIsRequeuedNotAbandoned(t *testing.T) {
	t.Parallel()
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
	turn, _, err := eng.Create(ctx, tasks.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	waitFor(t, "the turn to complete", func() bool { return status(turn.ID) == arbortype.StatusCompleted })
	held := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.held[conv] != nil
	}
	waitFor(t, "the conversation to be held", held)

	// No claim, reopen or flush of the runner's from here: the fence
	// fires, the conversation lapses, and its reopen waits.
	r.claimMu.Lock()
	locked := true
	defer func() {
		if locked {
			r.claimMu.Unlock()
		}
	}()
	r.lease.fire()
	r.mu.Lock()
	_, lapsed := r.lapsed[conv]
	r.mu.Unlock()
	require.True(t, lapsed, "the fence marked the conversation lapsed")

	once, _, err := eng.Create(ctx, tasks.CreateParams{ConversationID: conv, Kind: "once", AbandonOnRestart: true})
	require.NoError(t, err)
	// A flush's claim, committed while the conversation is lapsed.
	var claimed []arbortype.Task
	_, err = core.Tx(ctx, r.core, func(tx pgx.Tx) (struct{}, error) {
		p := r.claimParams(1)
		p.Conversations = []string{conv}
		var err error
		claimed, _, err = r.core.ClaimFor(ctx, tx, p)
		return struct{}{}, err
	})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "the claim took the task: its holder row is live, only the node's own clock fenced it")
	require.Equal(t, once.ID, claimed[0].ID)
	// Its slot, as a flush reserves one (the waiting reopen took the free
	// ones); dispatch gives it back when it does not start the run.
	r.mu.Lock()
	r.busy++
	r.mu.Unlock()
	r.dispatch(claimed)
	require.True(t, r.uncalled(claimed[0].Token), "dispatch did not start it: it stays unstarted")
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
