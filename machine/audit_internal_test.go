package machine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// TestAuditRepairsWhatTheNodeLostTrackOf: the node's memory and the
// database disagree in a way nothing but the audit repairs while the node
// lives and renews its lease (docs/architecture.md, "The audit"). Each case makes
// one such state by hand, as a split brain of the HA system or a commit
// whose answer was lost leaves it, and the task must then run to its end
// through the runner's own maintenance, with no restart counted:
//
//   - a run stopped as if the watchdog had read its task from an old
//     primary (its handler returns with its context cancelled, and writes
//     nothing): the task stays running under the node's lease;
//   - a run claimed and never dispatched (a claim whose answer was lost):
//     requeued, not abandoned, though its task is abandon_on_restart (no
//     handler saw it);
//   - a conversation held by this life in the database, which the node
//     forgot (an open whose answer was lost): its new task is never opened
//     by anyone; and the same with nothing in it, which the audit releases
//     before any task is created.
func TestAuditRepairsWhatTheNodeLostTrackOf(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"stopped by a stale read", "claimed and never dispatched", "held unawares", "held unawares, idle"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			auditRepairs(t, name)
		})
	}
}

func auditRepairs(t *testing.T, name string) {
	ctx := context.Background()
	entered := make(chan int64, 4)
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) },
		"work": func(ctx context.Context, run *Run) error {
			entered <- run.Task.Token
			if run.Task.Phase == "" && name == "stopped by a stale read" {
				if err := run.Checkpoint(ctx, "first", nil); err != nil {
					return err
				}
				<-ctx.Done() // until the "stale read" stops it
				return context.Cause(ctx)
			}
			return run.Complete(ctx, []byte(`"done"`))
		},
	}
	ir := startInternalRunner(t, handlers, func(c *RunnerConfig) {
		c.IdleRelease = time.Hour // the conversation stays held while idle
	})
	r, eng, conv := ir.r, ir.eng, ir.conv
	get := func(id int64) arbortype.Task { return ir.task(t, id) }
	ir.holdIdle(t)

	var (
		task arbortype.Task
		err  error
	)
	lostToken := int64(0)
	switch name {
	case "stopped by a stale read":
		task, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "work"})
		require.NoError(t, err)
		lostToken = <-entered
		waitFor(t, "the checkpoint", func() bool { return get(task.ID).Phase == "first" })
		r.stopRuns([]int64{task.ID}, []int64{lostToken}, ErrTaskStopped) // what the watchdog does when it reads the task from an old primary
		waitFor(t, "the stopped run to be gone", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.runs[task.ID] == nil
		})
		require.Equal(t, arbortype.StatusRunning, get(task.ID).Status, "the stopped run wrote nothing")

	case "claimed and never dispatched":
		r.claimMu.Lock() // no claim of the runner's from here
		task, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "work", AbandonOnRestart: true})
		if err == nil {
			var claimed []arbortype.Task
			_, err = core.Tx(ctx, r.core, func(tx pgx.Tx) (struct{}, error) {
				p := r.claimParams(1)
				p.Conversations = []string{conv}
				var err error
				claimed, _, err = r.core.ClaimFor(ctx, tx, p)
				return struct{}{}, err
			})
			if err == nil && len(claimed) == 1 {
				lostToken = claimed[0].Token
			}
		}
		r.claimMu.Unlock()
		require.NoError(t, err)
		require.NotZero(t, lostToken, "the claim took the task")

	case "held unawares":
		r.mu.Lock()
		delete(r.held, conv)
		r.mu.Unlock()
		task, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "work"})
		require.NoError(t, err)

	case "held unawares, idle":
		// Nothing to claim in it: only the audit's release frees it.
		r.mu.Lock()
		delete(r.held, conv)
		r.mu.Unlock()
		waitFor(t, "the audit to release the conversation", func() bool {
			var holder *int64
			require.NoError(t, ir.pool.QueryRow(ctx, `SELECT holder_id FROM `+ir.schema+`.conversations WHERE id = $1`, conv).Scan(&holder))
			return holder == nil
		})
		task, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "work"})
		require.NoError(t, err)
	}

	waitFor(t, "the task to complete", func() bool { return get(task.ID).Status == arbortype.StatusCompleted })
	got := get(task.ID)
	require.Zero(t, got.Attempt, "no restart counted")
	require.Equal(t, `"done"`, string(got.Result))
	if lostToken != 0 {
		var last int64
		for len(entered) > 0 {
			last = <-entered
		}
		require.NotEqual(t, lostToken, last, "the task ran again under a new claim, not the lost one's token")
	}
}

// TestAuditLeavesLiveRunsAlone: what the audit must never take for lost —
// a handler still running, through several audits, and a run whose
// ending is still queued in the completer after the handler stopped
// waiting for it (Complete called with a context of the handler's own that
// ended first; the run is gone from the node's runs). The test holds
// Runner.claimMu for writing meanwhile, so that no flush lands the ending
// before the audit's look. The task completes once, by its one run.
func TestAuditLeavesLiveRunsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	entered := make(chan int64, 4)
	proceed := make(chan struct{})
	handlers := map[string]Handler{
		"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) },
		"late": func(ctx context.Context, run *Run) error {
			entered <- run.Task.Token
			<-proceed
			own, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_ = run.Complete(own, []byte(`"done"`)) // its context ends before the flush can run
			return nil
		},
	}
	ir := startInternalRunner(t, handlers, func(c *RunnerConfig) { c.IdleRelease = time.Hour })
	r, eng, conv := ir.r, ir.eng, ir.conv
	get := func(id int64) arbortype.Task { return ir.task(t, id) }
	ir.holdIdle(t)

	task, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "late", AbandonOnRestart: true})
	require.NoError(t, err)
	token := <-entered
	for range 3 {
		r.audit(ctx)
	}
	got := get(task.ID)
	require.Equal(t, arbortype.StatusRunning, got.Status, "a running handler's task is left alone")
	require.Equal(t, token, got.Token)

	r.claimMu.Lock()
	locked := true
	defer func() {
		if locked {
			r.claimMu.Unlock()
		}
	}()
	close(proceed)
	waitFor(t, "the run to be gone from the node's runs, its ending queued", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.runs[task.ID] == nil
	})
	require.Equal(t, arbortype.StatusRunning, get(task.ID).Status, "the ending is still queued")
	holderID, _ := r.lease.holder()
	inDB, err := r.core.HeldBy(ctx, r.core.Pool, r.cfg.NodeID, holderID)
	require.NoError(t, err)
	running, err := r.core.RunningIn(ctx, r.core.Pool, []string{conv})
	require.NoError(t, err)
	require.Len(t, running, 1)
	lost, unaware := r.auditFind(holderID, inDB, running)
	require.Empty(t, lost, "a run whose ending is queued is not lost")
	require.Empty(t, unaware)
	r.claimMu.Unlock()
	locked = false

	waitFor(t, "the task to complete", func() bool { return get(task.ID).Status == arbortype.StatusCompleted })
	require.Equal(t, `"done"`, string(get(task.ID).Result))
	require.Len(t, entered, 0, "one call of the handler")
}
