package machine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// TestRunnerLeavesALeasedConversationAlone: a caller runs a task itself
// under a Lease while a Runner that knows the task's kind polls beside it.
// The runner neither requeues the caller's running task nor starts the
// conversation's pending work; once the caller releases, it runs that work.
// A probe conversation created after the caller's start tells when the
// runner has been through its claim loop since: the probe ran.
func TestRunnerLeavesALeasedConversationAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan int64, 16)
	handler := func(ctx context.Context, run *machine.Run) error {
		ran <- run.Task.ID
		return run.Complete(ctx, []byte(`"by the runner"`))
	}
	fastRunner(t, b, map[string]machine.Handler{"work": handler, "probe": handler}, nil)
	probe := func() {
		t.Helper()
		p, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-probe", Kind: "probe"})
		require.NoError(t, err)
		for id := range ran {
			if id == p.ID {
				return
			}
			t.Fatalf("the runner ran task %d of the leased conversation", id)
		}
	}

	// The conversation exists (a task of a kind no runner knows) before the
	// caller takes its lease; the work comes after, so no claim can slip in.
	placeholder, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "unknown_here"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Holder: "caller"})
	require.NoError(t, err)
	manual, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)
	run, err := lease.Start(b.ctx, manual.ID)
	require.NoError(t, err)
	pending, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)

	probe()
	require.NoError(t, run.Checkpoint(b.ctx, "mine", nil), "the caller's run is still its own")
	got := b.get(t, manual.ID)
	require.Equal(t, arbortype.StatusRunning, got.Status)
	require.Equal(t, run.Task.Token, got.Token)
	require.Equal(t, 0, got.Attempt, "never requeued")
	require.Equal(t, arbortype.StatusPending, b.status(t, pending.ID), "the runner did not start the leased conversation's work")
	b.requireClean(t)

	require.NoError(t, run.Complete(b.ctx, []byte(`"by the caller"`)))
	// The placeholder is the oldest generation (turn) of the conversation:
	// it would hold the next one back (one turn at a time).
	_, err = b.engine.Cancel(b.ctx, placeholder.ID, nil)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.ctx))
	require.Equal(t, pending.ID, <-ran, "released, the conversation's work goes to the runner")
	waitUntil(t, "the pending task to complete", func() bool { return b.status(t, pending.ID) == arbortype.StatusCompleted })
	require.JSONEq(t, `"by the caller"`, string(b.get(t, manual.ID).Result))
	b.requireClean(t, b.conv+"-probe")
}

// TestLeaseReleaseRecoversItsRuns: a run still going when its lease is
// released is recovered in the release's transaction, so that its late
// writes are refused (a holder that released writes nothing).
func TestLeaseReleaseRecoversItsRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	run, err := lease.Start(b.ctx, task.ID)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.ctx))
	require.ErrorIs(t, run.Complete(b.ctx, nil), arbortype.ErrNotRunning)
	got := b.get(t, task.ID)
	require.Equal(t, arbortype.StatusPending, got.Status)
	require.Equal(t, 0, got.Attempt, "a release is the holder's own: not a restart")
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, conv.Holder)
	b.requireClean(t)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

func TestAcquireLeaseBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := machine.AcquireLease(b.ctx, b.engine.Engine, "no-such-conversation", nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = machine.AcquireLease(b.ctx, nil, b.conv, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "work"})
	require.NoError(t, err)
	_, err = machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Duration: -1})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	for _, holder := range []string{"a\x00b", "bad \xff utf-8"} {
		_, err = machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, &machine.LeaseConfig{Holder: holder})
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "holder %q", holder)
	}
	other, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-other", Kind: "work"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	_, err = lease.Start(b.ctx, other.ID)
	require.ErrorIs(t, err, arbortype.ErrForeignTask)
	// Work refuses what Start refuses, and a nil handler, before it calls
	// anything: the task stays pending.
	called := false
	handler := func(context.Context, *machine.Run) error { called = true; return nil }
	_, err = lease.Work(b.ctx, other.ID, handler)
	require.ErrorIs(t, err, arbortype.ErrForeignTask)
	_, err = lease.Work(b.ctx, 1<<50, handler)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = lease.Work(b.ctx, other.ID, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	require.False(t, called)
	require.Equal(t, arbortype.StatusPending, b.status(t, other.ID))
	require.NoError(t, lease.Release(b.ctx))
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	_, err = b.engine.AbortConversation(b.ctx, b.conv+"-other")
	require.NoError(t, err)
}
