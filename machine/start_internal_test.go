package machine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAGrantYieldsToQueuedWorkWhenWorkersAreScarce (docs/design.md §3.18,
// §3.15): a create may start its task while workers are plentiful, work
// queued or not; once no more than startHeadroom are free (but for the
// claims in flight), it starts nothing while the producer knows of work
// waiting — that work is claimed first, in its fair order.
func TestAGrantYieldsToQueuedWorkWhenWorkersAreScarce(t *testing.T) {
	t.Parallel()
	ir := startInternalRunner(t, map[string]Handler{"turn": func(ctx context.Context, run *Run) error { return run.Complete(ctx, nil) }}, func(c *RunnerConfig) {
		c.Workers = startHeadroom + 10
		c.PollInterval = time.Hour // no scan of the producer's own meanwhile
	})
	r := ir.r
	waitFor(t, "the producer's first pass to end", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.busy == 0
	})
	grant := func() bool {
		g := starter{r}.Grant(1)
		if g == nil {
			return false
		}
		g.Done(nil, nil) // nothing started: the worker goes back
		return true
	}
	set := func(busy int, news bool) {
		r.mu.Lock()
		r.busy = busy
		r.mu.Unlock()
		r.prod.mu.Lock()
		r.prod.news, r.prod.dirty, r.prod.wantOpen = map[string]bool{}, map[string]bool{}, false
		if news {
			r.prod.news["queued"] = true
		}
		r.prod.mu.Unlock()
	}
	defer set(0, false)

	set(0, true)
	require.True(t, grant(), "plenty of workers: a create starts its task, work queued or not")
	set(10, false)
	require.True(t, grant(), "scarce, nothing queued")
	set(10, true)
	require.False(t, grant(), "scarce, work queued: it goes first")
	set(startHeadroom+10, false)
	require.False(t, grant(), "no worker free")
}
