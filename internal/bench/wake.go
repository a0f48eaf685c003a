package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Scenario (e): wake lateness, after machine/bench_test.go's
// BenchmarkWakeLateness, with a shorter window so that the largest size
// stays well under half a minute.

const (
	// wakeMin: each sleep is due wakeMin + U[0, env.WakeSpread) after its
	// sleep commits.
	wakeMin = 100 * time.Millisecond
	// wakeBound bounds the wait for the last wake: River alone promotes
	// scheduled jobs every ~5 s, so every sleep is woken well within it.
	wakeBound = time.Minute
)

// wakeTimers: a machine.Waker with production settings (its timers and
// River's wake jobs).
func wakeTimers(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return wakeLateness(ctx, env, size, true)
}

// wakeRiverOnly: the same Waker with DisableTimers: River's wake jobs alone.
func wakeRiverOnly(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return wakeLateness(ctx, env, size, false)
}

// wakeLateness puts N tasks to sleep (create, start, SleepUntil: the
// engine's own calls, three transactions each, on env.Conns goroutines),
// each until wakeMin + U[0, env.WakeSpread) from its sleep, and records, per
// task, the time from its wake time to the moment the waker reports its
// wake committed (WakerConfig.OnWake, called after the commit): the
// lateness a handler would see before it can be claimed again.
func wakeLateness(ctx context.Context, env *Env, size Size, timers bool) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var (
		mu      sync.Mutex
		wakeAt  = map[int64]time.Time{}
		wokeAt  = map[int64]time.Time{}
		byRiver int
		woken   = make(chan struct{}, 1)
	)
	var warmID atomic.Int64 // the warm-up's wake may be reported after the warm-up
	onWake := func(ev machine.Wake) {
		now := time.Now()
		if ev.TaskID == warmID.Load() {
			return
		}
		mu.Lock()
		wokeAt[ev.TaskID] = now
		if ev.By == machine.WokenByRiver {
			byRiver++
		}
		mu.Unlock()
		select {
		case woken <- struct{}{}:
		default:
		}
	}
	wk, err := machine.NewWaker(eng, &machine.WakerConfig{DisableTimers: !timers, OnWake: onWake, Logger: env.Logger})
	if err != nil {
		return Measurement{}, err
	}
	if err := wk.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = wk.Stop(stopCtx)
	}()

	// Warm up (not timed): a sleep already due is woken once River's
	// client works its queue.
	warm, err := sleepFor(ctx, eng, "wake-warm", "warm", -time.Millisecond)
	if err != nil {
		return Measurement{}, err
	}
	warmID.Store(warm.ID)
	for {
		t, err := eng.Get(ctx, warm.ID)
		if err != nil {
			return Measurement{}, err
		}
		if t.Status == arbortype.StatusPending {
			break
		}
		select {
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("warm-up sleep never woke: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	mu.Lock()
	wokeAt, byRiver = map[int64]time.Time{}, 0
	mu.Unlock()

	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
		d := wakeMin
		if env.WakeSpread > 0 {
			d += rand.N(env.WakeSpread)
		}
		t, err := sleepFor(ctx, eng, fmt.Sprintf("wake-%d", i), "sleeper", d)
		if err != nil {
			return err
		}
		mu.Lock()
		wakeAt[t.ID] = *t.WakeAt
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("sleep: %w", err)
	}
	slept := time.Now()
	bound := time.NewTimer(wakeBound)
	defer bound.Stop()
	for {
		mu.Lock()
		all := len(wokeAt) >= size.N
		n := len(wokeAt)
		mu.Unlock()
		if all {
			break
		}
		select {
		case <-woken:
		case <-bound.C:
			return Measurement{}, fmt.Errorf("%w: %d of %d sleeps woken within %s", errUnfinished, n, size.N, wakeBound)
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("%w: %d of %d sleeps woken: %w", errUnfinished, n, size.N, ctx.Err())
		}
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}

	mu.Lock()
	defer mu.Unlock()
	for id, at := range wakeAt {
		woke, ok := wokeAt[id]
		if !ok {
			return Measurement{}, fmt.Errorf("task %d: woken, but not one of this run's sleeps", id)
		}
		m.Latencies = append(m.Latencies, woke.Sub(at))
	}
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE kind = 'sleeper' AND status = 'pending'`, size.N); err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	m.Phases = map[string]time.Duration{"sleep": slept.Sub(start), "until last wake": end.Sub(slept)}
	m.Note = fmt.Sprintf("%d of %d wakes by River's job", byRiver, size.N)
	if timers {
		m.Note = ""
		if byRiver > 0 {
			m.Note = fmt.Sprintf("%d of %d wakes by River's job, the rest by timers", byRiver, size.N)
		}
	}
	return m, nil
}

// sleepFor creates a root task in conv, starts it and puts it to sleep for d.
func sleepFor(ctx context.Context, eng *tasks.Engine, conv, kind string, d time.Duration) (arbortype.Task, error) {
	t, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: kind})
	if err != nil {
		return arbortype.Task{}, err
	}
	lease, err := machine.AcquireLease(ctx, eng, conv, &machine.LeaseConfig{Holder: "bench"})
	if err != nil {
		return arbortype.Task{}, err
	}
	run, err := lease.Start(ctx, t.ID)
	if err != nil {
		return arbortype.Task{}, err
	}
	if err := run.SleepUntil(ctx, time.Now().Add(d), "bench", nil); err != nil {
		return arbortype.Task{}, err
	}
	if err := lease.Release(ctx); err != nil {
		return arbortype.Task{}, err
	}
	return eng.Get(ctx, t.ID)
}
