package machine

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// Without middleware or observer, what the hooks add to a run — the
// dispatch wrapper, the outcome kept by the ending write, the stop noted
// after it — allocates nothing.
// Not parallel: AllocsPerRun refuses a parallel test.
func TestHooksCostNoAllocationWhenUnset(t *testing.T) {
	r := &Runner{cfg: (&RunnerConfig{}).WithDefaults()}
	r.runWith = func(ctx context.Context, run *Run) { run.noteStop(ctx) }
	run := &Run{}
	ctx := context.Background()
	o, res := core.Outcome{Kind: core.OutWait}, core.OutcomeResult{Woken: true}
	allocs := testing.AllocsPerRun(1000, func() {
		run.record(o, res, nil)
		r.run(ctx, run)
	})
	require.Zero(t, allocs)
	require.Equal(t, Outcome{Kind: OutcomeWaiting, Woken: true}, run.Outcome())
}

// A refused ending write is OutcomeNone with the refusal; a stopped run
// that wrote nothing has its context's cause.
func TestOutcomeOfARunThatEndedWithoutItsWrite(t *testing.T) {
	t.Parallel()
	refused := &Run{}
	refused.record(core.Outcome{Kind: core.OutComplete}, core.OutcomeResult{Err: arbortype.ErrAborted}, nil)
	refused.noteStop(context.Background())
	require.Equal(t, OutcomeNone, refused.Outcome().Kind)
	require.ErrorIs(t, refused.Outcome().Err, arbortype.ErrAborted)

	stopped := &Run{}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrTaskStopped)
	stopped.noteStop(ctx)
	require.True(t, errors.Is(stopped.Outcome().Err, ErrTaskStopped))

	failed := &Run{}
	herr := errors.New("tool broke")
	failed.record(core.Outcome{Kind: core.OutFail}, core.OutcomeResult{}, herr)
	require.Equal(t, Outcome{Kind: OutcomeFailed, Err: herr}, failed.Outcome())
}
