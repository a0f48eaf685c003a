package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// Scenario (k): a Runner's reflexes, through a machine.Runner with
// RunnerConfig{}: how late a sleeping task's handler is re-entered, and how
// soon a fail_fast sibling's handler hears that it was aborted.

// sleepReentry runs N turns (a conversation each) whose handler sleeps
// sleepFor (SleepUntil) and, run again, notes when it was entered. The
// latency is that entry minus the wake time asked for: the local timer,
// the wake's transaction, the claim and the handler's start.
func sleepReentry(ctx context.Context, env *Env, size Size) (Measurement, error) {
	const sleepFor = 1500 * time.Millisecond
	var (
		mu      sync.Mutex
		wakeAt  = map[int64]time.Time{}
		lates   []time.Duration
		results = make(chan struct{}, size.N)
	)
	handlers := map[string]machine.Handler{
		"sleeper": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "woke" {
				now := time.Now()
				mu.Lock()
				lates = append(lates, now.Sub(wakeAt[run.Task.ID]))
				mu.Unlock()
				results <- struct{}{}
				return run.Complete(ctx, nil)
			}
			at := time.Now().Add(sleepFor + spread(env, run.Task.ID))
			mu.Lock()
			wakeAt[run.Task.ID] = at
			mu.Unlock()
			return run.SleepUntil(ctx, at, "woke", nil)
		},
	}
	return reflexRun(ctx, env, size, handlers, "sleeper", results, func(m *Measurement) {
		mu.Lock()
		defer mu.Unlock()
		m.Latencies = lates
		m.Note = fmt.Sprintf("each sleep %s + U[0, %s); latency = the handler's re-entry minus the wake time asked for", sleepFor, env.WakeSpread)
	})
}

// siblingCancel runs N groups (a conversation each): a handler that spawns
// a sibling and a doomed child and waits on both under fail_fast; the
// sibling's handler waits for its context; the doomed child fails (non
// retryable) once the sibling runs. The latency is the sibling's context's
// cancellation (context.AfterFunc) minus the doomed handler's return: the
// failure's flush, its fail_fast abort, and the cancel of the sibling's
// handler on this node.
func siblingCancel(ctx context.Context, env *Env, size Size) (Measurement, error) {
	var (
		mu      sync.Mutex
		running = map[int64]chan struct{}{} // group id → closed when its sibling runs
		failed  = map[int64]time.Time{}     // group id → the doomed handler returned
		cancels []time.Duration
		results = make(chan struct{}, size.N)
		errDoom = errors.New("the tool refused the call")
		started = func(group int64) chan struct{} { // under mu
			if running[group] == nil {
				running[group] = make(chan struct{})
			}
			return running[group]
		}
	)
	handlers := map[string]machine.Handler{
		"group": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "decided" {
				return run.Complete(ctx, nil)
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "sibling"}, {Kind: "doomed"}})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kids[0].ID, kids[1].ID}, Policy: arbortype.FailFast, Phase: "decided"})
		},
		"sibling": func(ctx context.Context, run *machine.Run) error {
			group := run.Task.OwnerID
			mu.Lock()
			if ch := started(group); !closedCh(ch) {
				close(ch) // once: a run stopped otherwise (a fence) runs again
			}
			mu.Unlock()
			<-ctx.Done()
			// The handler's own view: when its context told it to stop.
			// (An AfterFunc whose stop the handler defers can lose the race
			// to it: Done closes before the context's children are
			// cancelled.)
			now := time.Now()
			mu.Lock()
			at, ok := failed[group]
			if ok {
				cancels = append(cancels, now.Sub(at))
			}
			mu.Unlock()
			// A run stopped before its doomed sibling failed (a fence on a
			// starved machine) is not the cancel measured: it is recovered
			// and runs again.
			if ok {
				results <- struct{}{}
			}
			return ctx.Err()
		},
		"doomed": func(ctx context.Context, run *machine.Run) error {
			group := run.Task.OwnerID
			mu.Lock()
			ch := started(group)
			mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
			select { // failures spread, not a burst
			case <-time.After(spread(env, group)):
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			failed[group] = time.Now()
			mu.Unlock()
			return machine.NonRetryable(errDoom)
		},
	}
	return reflexRun(ctx, env, size, handlers, "group", results, func(m *Measurement) {
		mu.Lock()
		defer mu.Unlock()
		m.Latencies = cancels
		m.Note = fmt.Sprintf("failures spread over %s; latency = the sibling's handler seeing its context done minus the doomed child's handler returning its error", env.WakeSpread)
	})
}

// closedCh says whether ch is closed.
func closedCh(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// spread is a task's share of env.WakeSpread, so that the events measured
// are spread over it rather than come in one burst (which would measure
// queueing).
func spread(env *Env, id int64) time.Duration {
	if env.WakeSpread <= 0 {
		return 0
	}
	return time.Duration(uint64(id)*2654435761%1000) * env.WakeSpread / 1000
}

// reflexRun creates N root tasks of kind (a conversation each) under a
// Runner with handlers, waits for N results, and lets fill set the
// latencies.
func reflexRun(ctx context.Context, env *Env, size Size, handlers map[string]machine.Handler, kind string,
	results chan struct{}, fill func(*Measurement)) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("reflex-%d", i), Kind: kind})
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create: %w", err)
	}
	for i := range size.N {
		select {
		case <-results:
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("%w: %d of %d done (%s): %w", errUnfinished, i, size.N, leftBehind(ctx, env), ctx.Err())
		}
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	m.Elapsed = time.Since(start)
	fill(&m)
	if len(m.Latencies) != size.N {
		return Measurement{}, fmt.Errorf("%d latencies, want %d", len(m.Latencies), size.N)
	}
	return m, nil
}
