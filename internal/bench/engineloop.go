package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// Back-off of an engine loop worker whose claim came back empty: from the
// first to the longest, doubling. 20 ms is the FetchPollInterval River
// recommends for benchmarks, so neither side waits longer between polls.
const (
	idleBackoffFirst = time.Millisecond
	idleBackoffMax   = 20 * time.Millisecond
)

// engineLoop is the engine-loop reference line: no runner, no leases;
// workers goroutines claim pending tasks in batches (the store's unfenced
// claim, which only this reference line uses) and pass each
// claimed batch to handle (see eachTask and batchTx). It returns when done
// is closed, when ctx ends (its error) or when a handler fails (that
// error). A runner-based variant of a scenario replaces the whole loop, not
// the handlers' meaning: same tasks, same outcome.
func engineLoop(ctx context.Context, eng *tasks.Engine, workers, batch int, done <-chan struct{},
	handle func(ctx context.Context, claimed []arbortype.Task) error) error {
	c := core.Of(eng)
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
				claimed, err := c.Store.ClaimTasksUnfenced(ctx, c.Pool, batch, arbortype.StatusRunning, c.Cfg.TaskLease)
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
				if err := handle(ctx, claimed); err != nil {
					cancel(err)
					return
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

// eachTask runs fn on every claimed task in turn: each engine operation in
// a transaction of its own, as arbor's pool forms do.
func eachTask(fn func(ctx context.Context, t arbortype.Task) error) func(context.Context, []arbortype.Task) error {
	return func(ctx context.Context, claimed []arbortype.Task) error {
		for _, t := range claimed {
			if err := fn(ctx, t); err != nil {
				return err
			}
		}
		return nil
	}
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

// completeTask completes a claimed task through the engine, in tx when not
// nil (a batch's transaction), else in a transaction of its own.
func completeTask(ctx context.Context, eng *tasks.Engine, tx pgx.Tx, t arbortype.Task) (arbortype.Task, error) {
	c := core.Of(eng)
	if tx != nil {
		return core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) { return c.Complete(ctx, tx, t.ID, t.Token, nil) })
	}
	return core.Tx(ctx, c, func(tx pgx.Tx) (arbortype.Task, error) { return c.Complete(ctx, tx, t.ID, t.Token, nil) })
}
