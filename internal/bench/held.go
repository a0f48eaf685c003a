package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// Scenario (g): one Runner holding N conversations.

// heldActive is how many of the held conversations take turns in the timed
// phase, and heldTurns how many turns each takes, one after the other: the
// same work at every N, so that what changes is only how many idle
// conversations the runner holds beside it.
const (
	heldActive = 100
	heldTurns  = 10
)

// heldRunner is scenario (g) through a machine.Runner with RunnerConfig{}:
// first (not timed) one turn in each of N conversations, so that the runner
// holds all N (IdleRelease, a minute by default, keeps them); then
// min(N, 100) of them each take heldTurns turns in a closed loop — create a
// turn, wait until it completed, create the next — while the other
// conversations stay held and idle. A turn spawns two children at once,
// waits on them (all_settled) and completes: three tasks. Figures: tasks/s
// of the timed phase, the p50/p99 of a turn's latency (its Create's return
// to its completion, in the Note), the runner's lease warnings over the
// whole run, and the heap the held conversations take (after a GC, before
// the warm-up and after it, over N).
func heldRunner(ctx context.Context, env *Env, size Size) (Measurement, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()

	var (
		mu    sync.Mutex
		turns = map[int64]chan struct{}{} // root id → closed when it completed
		early = map[int64]bool{}          // completed before its waiter registered
	)
	completed := func(id int64) {
		mu.Lock()
		defer mu.Unlock()
		if ch, ok := turns[id]; ok {
			close(ch)
			delete(turns, id)
			return
		}
		early[id] = true
	}
	await := func(id int64) <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		ch := make(chan struct{})
		if early[id] {
			delete(early, id)
			close(ch)
			return ch
		}
		turns[id] = ch
		return ch
	}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == phaseWaiting {
				if err := run.Complete(ctx, nil); err != nil {
					return err
				}
				completed(run.Task.ID)
				return nil
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "tool"}, {Kind: "tool"}})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kids[0].ID, kids[1].ID}, Policy: arbortype.AllSettled, Phase: phaseWaiting})
		},
		"tool": func(ctx context.Context, run *machine.Run) error { return nil },
	}
	warnings := &warnCounter{Handler: env.Logger.Handler()}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: slog.New(warnings)})
	if err != nil {
		return Measurement{}, err
	}
	if err := r.Start(ctx); err != nil {
		return Measurement{}, err
	}
	defer stopRunner(ctx, env, r)

	conv := func(i int) string { return fmt.Sprintf("held-%d", i) }
	heapBefore := heapInUse()
	// Warm-up: a turn in every conversation, created in batches.
	batch := insertBatch(size.N, env.Conns)
	batches := splitBatches(size.N, batch)
	roots := make([]int64, size.N)
	err = parallel(ctx, env.Conns, len(batches), func(ctx context.Context, b int) error {
		ps := make([]arbortype.CreateParams, batches[b])
		for j := range ps {
			ps[j] = arbortype.CreateParams{ConversationID: conv(b*batch + j), Kind: "turn"}
		}
		ts, _, err := eng.CreateMany(ctx, ps)
		for j, t := range ts {
			roots[b*batch+j] = t.ID
		}
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("warm-up: %w", err)
	}
	for _, id := range roots {
		select {
		case <-await(id):
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("%w: warm-up: %s: %w", errUnfinished, leftBehind(ctx, env), ctx.Err())
		}
	}
	if held := len(r.Held()); held != size.N {
		return Measurement{}, fmt.Errorf("the runner holds %d conversations after the warm-up, want %d", held, size.N)
	}
	heapHeld := heapInUse()

	active := min(size.N, heldActive)
	var lat []time.Duration
	var latMu sync.Mutex
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, active, active, func(ctx context.Context, i int) error {
		for range heldTurns {
			t, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv(i), Kind: "turn"})
			if err != nil {
				return err
			}
			created := time.Now()
			select {
			case <-await(t.ID):
			case <-ctx.Done():
				return fmt.Errorf("%w: %s: %w", errUnfinished, leftBehind(ctx, env), ctx.Err())
			}
			latMu.Lock()
			lat = append(lat, time.Since(created))
			latMu.Unlock()
		}
		return nil
	})
	if err != nil {
		return Measurement{}, err
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	stillHeld := len(r.Held())
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, 3*(size.N+active*heldTurns)); err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	m.Tasks = 3 * active * heldTurns
	perConv := float64(heapHeld-heapBefore) / float64(size.N)
	m.Note = fmt.Sprintf("N=%d: %d conversations active (%d turns each, closed loop), %d held idle beside them (still held at the end: %d); "+
		"turn latency (Create's return → turn completed) p50 %.1f ms, p99 %.1f ms; lease warnings %d; "+
		"heap per held conversation %.0f B (%s in all)",
		size.N, active, heldTurns, size.N-active, stillHeld,
		micros(percentile(lat, 0.5))/1e3, micros(percentile(lat, 0.99))/1e3, warnings.lease.Load(),
		perConv, bytesText(heapHeld-heapBefore))
	return m, nil
}

// heapInUse is the heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// warnCounter passes records on and counts the warnings about leases.
type warnCounter struct {
	slog.Handler
	lease atomic.Int64
}

func (w *warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, "lease") {
		w.lease.Add(1)
	}
	return w.Handler.Handle(ctx, r)
}

func (w *warnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnCounterChild{Handler: w.Handler.WithAttrs(as), parent: w}
}

func (w *warnCounter) WithGroup(name string) slog.Handler {
	return &warnCounterChild{Handler: w.Handler.WithGroup(name), parent: w}
}

// warnCounterChild counts into its parent.
type warnCounterChild struct {
	slog.Handler
	parent *warnCounter
}

func (w *warnCounterChild) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, "lease") {
		w.parent.lease.Add(1)
	}
	return w.Handler.Handle(ctx, r)
}

func (w *warnCounterChild) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnCounterChild{Handler: w.Handler.WithAttrs(as), parent: w.parent}
}

func (w *warnCounterChild) WithGroup(name string) slog.Handler {
	return &warnCounterChild{Handler: w.Handler.WithGroup(name), parent: w.parent}
}
