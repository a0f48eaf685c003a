package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// Scenario (f): child settles → parent's handler runs again.

// resumeRunner runs N parents, each the turn of a conversation of its own,
// through one machine.Runner with RunnerConfig{} (Workers 1,000: at every
// size a worker is free when a parent is woken, so no time is spent
// queueing for one). A parent's handler spawns one child and waits on
// it (all_settled); the child's handler notes the time it calls Complete
// and completes; the parent's handler, run again, notes the time it was
// entered and completes. The latency, per parent, is the second time minus
// the first: the child's settle transaction (which wakes the waiting
// parent) and its commit, the notification, the machine's claim and the
// handler's start. The time from the commit itself cannot be noted from the
// handlers: the parent may be re-entered before the child's Complete has
// returned; the Note gives the settle transactions' own p50/p99 so that
// the reader can subtract it.
//
// The parents run twice on the same runner: a cold round of
// max(N, coldParents), then the timed round of N. A fresh backend pays for
// its first statements (the catalog read into its caches, each statement
// parsed, and planned afresh for its first five executions: 20–80 ms for a
// create's first execution on this machine), and at N = 50 those first
// executions were most of the run; the timed round measures the steady
// state a runner that has been up for a while gives. The Note gives the
// cold round's p50/p99 beside it. Elapsed runs from the
// timed round's first parent created to its last parent completed.
// coldParents is the least number of parents of (f)'s cold round: enough
// for every connection of the runner's pool and the harness's to have run
// each of the scenario's statements more than five times (past the
// prepared statement's custom plans).
const coldParents = 200

func resumeRunner(ctx context.Context, env *Env, size Size) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var (
		mu       sync.Mutex
		settled  = map[int64]time.Time{}     // parent id → its child's handler called Complete
		settles  = map[int64]time.Duration{} // parent id → how long its child's Complete took
		resumed  = map[int64]time.Time{}     // parent id → its handler entered again
		round    = map[int64]int{}           // parent id → its round
		finished int
		want     int // parents of the round running
		done     chan struct{}
	)
	roundOf := func(conv string) int {
		if strings.HasPrefix(conv, "resume-cold-") {
			return 0
		}
		return 1
	}
	finish := func() { // under mu
		finished++
		if finished == want {
			close(done)
		}
	}
	handlers := map[string]machine.Handler{
		"parent": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "waiting" {
				now := time.Now()
				mu.Lock()
				resumed[run.Task.ID] = now
				round[run.Task.ID] = roundOf(run.Task.ConversationID)
				mu.Unlock()
				if err := run.Complete(ctx, nil); err != nil {
					return err
				}
				mu.Lock()
				finish()
				mu.Unlock()
				return nil
			}
			child, err := run.Spawn(ctx, machine.SpawnParams{Kind: "child"})
			if err != nil {
				return err
			}
			// A child that settled before the wait commits wakes the parent
			// in the wait's own transaction: it is re-entered all the same.
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{child.ID}, Policy: arbortype.AllSettled, Phase: "waiting"})
		},
		"child": func(ctx context.Context, run *machine.Run) error {
			// Noted before the call: the parent can be re-entered (on
			// another goroutine) before Complete has returned here.
			called := time.Now()
			mu.Lock()
			settled[run.Task.OwnerID] = called
			mu.Unlock()
			if err := run.Complete(ctx, nil); err != nil {
				return err
			}
			took := time.Since(called)
			mu.Lock()
			settles[run.Task.OwnerID] = took
			mu.Unlock()
			return nil
		},
	}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)

	runRound := func(prefix string, n int) error {
		mu.Lock()
		finished, want, done = 0, n, make(chan struct{})
		ch := done
		mu.Unlock()
		err := parallel(ctx, env.Conns, n, func(ctx context.Context, i int) error {
			_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s%d", prefix, i), Kind: "parent"})
			return err
		})
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			mu.Lock()
			got := finished
			mu.Unlock()
			return fmt.Errorf("%w: %d of %d parents completed (%s): %w", errUnfinished, got, n, leftBehind(ctx, env), ctx.Err())
		}
	}
	coldN := max(size.N, coldParents)
	if err := runRound("resume-cold-", coldN); err != nil {
		return Measurement{}, fmt.Errorf("cold round: %w", err)
	}
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	if err := runRound("resume-", size.N); err != nil {
		return Measurement{}, err
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	var cold, coldSettles, timedSettles []time.Duration
	for parent, at := range resumed {
		s, ok := settled[parent]
		if !ok {
			return Measurement{}, fmt.Errorf("parent %d ran again with no child settled", parent)
		}
		if round[parent] == 0 {
			cold = append(cold, at.Sub(s))
			coldSettles = append(coldSettles, settles[parent])
			continue
		}
		m.Latencies = append(m.Latencies, at.Sub(s))
		timedSettles = append(timedSettles, settles[parent])
	}
	if len(m.Latencies) != size.N || len(cold) != coldN {
		return Measurement{}, fmt.Errorf("%d parents resumed in the timed round and %d in the cold one, want %d and %d", len(m.Latencies), len(cold), size.N, coldN)
	}
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, 2*(size.N+coldN)); err != nil {
		return Measurement{}, err
	}
	var requeued, retried int
	if err := env.Pool.QueryRow(ctx, env.sql(`SELECT count(*) FILTER (WHERE attempt > 0), count(*) FILTER (WHERE retries > 0)
		FROM {schema}.tasks`)).Scan(&requeued, &retried); err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	ms := func(ds []time.Duration, q float64) float64 { return micros(percentile(ds, q)) / 1e3 }
	m.Note = fmt.Sprintf("tasks recovered (attempt > 0): %d, retried: %d; ", requeued, retried) +
		fmt.Sprintf("latency counted from the child's Complete call; that Complete itself (its transaction and commit) took p50 %.1f ms, p99 %.1f ms at N=%d; ",
			ms(timedSettles, 0.5), ms(timedSettles, 0.99), size.N) +
		fmt.Sprintf("the cold round before it (%d parents, fresh backends): latency p50 %.1f ms, p99 %.1f ms, its Completes p50 %.1f ms, p99 %.1f ms",
			coldN, ms(cold, 0.5), ms(cold, 0.99), ms(coldSettles, 0.5), ms(coldSettles, 0.99))
	return m, nil
}
