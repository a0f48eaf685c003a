package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/arborhq/arbor/tasks"
)

// Back-off of an engine loop worker whose claim came back empty: from the
// first to the longest, doubling. 20 ms is the FetchPollInterval River
// recommends for benchmarks, so neither side waits longer between polls.
const (
	idleBackoffFirst = time.Millisecond
	idleBackoffMax   = 20 * time.Millisecond
)

// engineLoop stands in for the node runner until issue 5 lands: workers
// goroutines claim pending tasks in batches with Engine.Claim and run handle
// on each claimed task in turn, every engine operation in a transaction of
// its own. It returns when done is closed, when ctx ends (its error) or
// when a handler fails (that error). A runner-based variant of a scenario
// replaces the whole loop, not the handlers' meaning: same tasks, same
// outcome.
func engineLoop(ctx context.Context, eng *tasks.Engine, workers, batch int, done <-chan struct{},
	handle func(ctx context.Context, t tasks.Task) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			backoff := idleBackoffFirst
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				default:
				}
				claimed, err := eng.Claim(ctx, tasks.ClaimParams{Limit: batch})
				if err != nil {
					cancel(err)
					return
				}
				if len(claimed) == 0 {
					select {
					case <-done:
					case <-ctx.Done():
					case <-time.After(backoff):
					}
					backoff = min(2*backoff, idleBackoffMax)
					continue
				}
				backoff = idleBackoffFirst
				for _, t := range claimed {
					if err := handle(ctx, t); err != nil {
						cancel(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
		return nil
	default:
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return errors.New("engine loop ended before its work was done")
}

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns the
// first error.
func parallel(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}
