package machine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// A concurrency limit of 2 over three runners: never more than two
// handlers of its key in flight at once (measured from their entries to
// their returns), every task runs, and every slot is given back. A slot
// freed on one runner is taken by another (within its PollInterval).
func TestConcurrencyLimitAcrossRunners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key, limit, n = "key:search", 2, 12
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, key, limit))
	var (
		mu       sync.Mutex
		inFlight int
		most     int
		entered  = make(chan int64, n)
		release  = make(chan struct{})
	)
	tool := func(ctx context.Context, run *machine.Run) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		entered <- run.Task.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return run.Complete(ctx, nil)
	}
	for range 3 {
		fastRunner(t, b, map[string]machine.Handler{"tool": tool}, nil)
	}
	var ids []int64
	for i := range n {
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%02d", b.conv, i),
			Kind: "tool", ConcurrencyKey: "search"})
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	// Each release lets one handler return; the next entry comes only
	// once its slot is given back.
	for i := range n {
		<-entered
		if i >= limit-1 {
			release <- struct{}{}
		}
	}
	for range limit - 1 {
		release <- struct{}{}
	}
	for _, id := range ids {
		b.waitStatus(t, id, arbortype.StatusCompleted)
	}
	mu.Lock()
	require.LessOrEqual(t, most, limit, "handlers of the key in flight at once")
	require.Equal(t, limit, most, "the limit was reached")
	mu.Unlock()
	waitUntil(t, "every slot given back", func() bool {
		ls, err := b.engine.ConcurrencyLimits(b.ctx)
		require.NoError(t, err)
		return len(ls) == 1 && ls[0].Running == 0
	})
}
