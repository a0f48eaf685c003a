package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Scenarios (m), (n) and (o): many tenants on one runner (docs/design.md
// §3.15). One machine.Runner with RunnerConfig{} runs two kinds of
// one-task conversations: "noop" turns, which complete at once (the flood,
// or the backlog, created with Engine.CreateMany in batches), and "turn"
// turns, which note the moment their handler is entered and complete
// (tenant B's, or the interactive ones: one Engine.Create every
// fairTick, each in a conversation of its own). A turn's start latency is
// its handler's entry minus its Create's return (after the commit; 0 when
// the handler was entered first).
//
//   - (m) fairness, latency: B's turns beside A's flood of N (created while
//     the flood runs, until it is done) against B's turns alone;
//   - (n) fairness, throughput: A's flood of N beside B's turns against A's
//     flood alone (time from A's first create to its last completion);
//   - (o) priorities, latency: interactive turns (priority 60) behind a
//     backlog of N background turns (priority 0, created before the runner
//     starts; the turns are created while it drains) against the same turns
//     with no backlog. One tenant.

const (
	// fairTick is how often tenant B (or the interactive user) creates a
	// turn.
	fairTick = 100 * time.Millisecond
	// fairAlone is how many turns B (or the interactive user) creates
	// alone, at most the size's N.
	fairAlone = 30
	// interactivePriority is the interactive turns' priority in (o).
	interactivePriority = 60
)

// fairRunner is a started machine.Runner with RunnerConfig{} whose "noop"
// handler completes and counts its task (done is closed at the n-th) and
// whose "turn" handler notes its entry and completes.
type fairRunner struct {
	eng *tasks.Engine
	// other is an engine of its own, on a pool of its own, with no runner:
	// the turns the ticker creates come from it, as from a web tier in
	// another process, so that the runner's claims and opens start them
	// (a create in the runner's own process may start its task itself,
	// docs/design.md §3.18, and would not wait on them).
	other     *tasks.Engine
	completed atomic.Int64
	done      chan struct{}
	stop      func()

	mu      sync.Mutex
	entered map[int64]time.Time
}

func startFairRunner(ctx context.Context, env *Env, n int) (*fairRunner, error) {
	pool, eng, err := machinePool(ctx, env)
	if err != nil {
		return nil, err
	}
	otherPool, other, err := machinePool(ctx, env)
	if err != nil {
		pool.Close()
		return nil, err
	}
	fr := &fairRunner{eng: eng, other: other, done: make(chan struct{}), entered: map[int64]time.Time{}}
	if n == 0 {
		close(fr.done)
	}
	handlers := map[string]machine.Handler{
		"noop": func(ctx context.Context, run *machine.Run) error {
			if err := run.Complete(ctx, nil); err != nil {
				return err
			}
			if fr.completed.Add(1) == int64(n) {
				close(fr.done)
			}
			return nil
		},
		"turn": func(ctx context.Context, run *machine.Run) error {
			at := time.Now()
			fr.mu.Lock()
			if _, ok := fr.entered[run.Task.ID]; !ok {
				fr.entered[run.Task.ID] = at
			}
			fr.mu.Unlock()
			return run.Complete(ctx, nil)
		},
	}
	r, err := machine.NewRunner(eng, handlers, &machine.RunnerConfig{PollInterval: env.RunnerPollInterval, Logger: env.Logger})
	if err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		pool.Close()
		otherPool.Close()
		return nil, err
	}
	fr.stop = func() {
		stopRunner(ctx, env, r)
		pool.Close()
		otherPool.Close()
	}
	return fr, nil
}

// ticker creates a turn of tenant (priority p) every fairTick, each in a
// conversation of its own, until stop is closed (after at least one; nil
// for never) or limit were created, and returns, once each has been entered, their start
// latencies.
func (fr *fairRunner) ticker(ctx context.Context, tenant string, p, limit int, stop <-chan struct{}) (lat, before []time.Duration, err error) {
	created := map[int64]time.Time{}
	tick := time.NewTicker(fairTick)
	defer tick.Stop()
	for i := 0; i < limit; i++ {
		if i > 0 {
			select {
			case <-stop:
				i = limit
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-tick.C:
			}
		}
		turn, _, err := fr.other.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-turn-%d", tenant, i),
			Kind: "turn", Tenant: tenant, Priority: p})
		if err != nil {
			return nil, nil, err
		}
		created[turn.ID] = time.Now()
	}
	for id, at := range created {
		got, err := fr.other.AwaitSettled(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		if got.Status != arbortype.StatusCompleted || got.StartedAt == nil {
			return nil, nil, fmt.Errorf("turn %d is %s", id, got.Status)
		}
		fr.mu.Lock()
		entered, ok := fr.entered[id]
		fr.mu.Unlock()
		if !ok {
			return nil, nil, fmt.Errorf("turn %d completed with no entry noted", id)
		}
		lat = append(lat, max(0, entered.Sub(at)))
		before = append(before, max(0, got.StartedAt.Sub(at)))
	}
	return lat, before, nil
}

// partsText describes the latencies' parts: before the transaction that
// started each began, and the rest.
func partsText(lat, before []time.Duration) string {
	rest := make([]time.Duration, len(lat))
	for i := range lat {
		rest[i] = max(0, lat[i]-before[i])
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("of which before the transaction that started it began: p50 %s, p99 %s; that transaction and the dispatch: p50 %s, p99 %s",
		r(percentile(before, 0.5)), r(percentile(before, 0.99)), r(percentile(rest, 0.5)), r(percentile(rest, 0.99)))
}

// createTenantNoops is createNoops with a tenant and a priority.
func createTenantNoops(ctx context.Context, env *Env, eng *tasks.Engine, prefix, tenant string, p, n int) error {
	batch := insertBatch(n, env.Conns)
	batches := splitBatches(n, batch)
	return parallel(ctx, env.Conns, len(batches), func(ctx context.Context, b int) error {
		ps := make([]arbortype.CreateParams, batches[b])
		for j := range ps {
			ps[j] = arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%d", prefix, b*batch+j), Kind: "noop",
				Tenant: tenant, Priority: p}
		}
		_, _, err := eng.CreateMany(ctx, ps)
		return err
	})
}

// floodRun is one run of (m) or (n): tenant A's flood of size.N (when
// flood), tenant B's turns every fairTick (when withB: while the flood
// runs, or fairAlone of them with no flood). It returns B's start
// latencies, and the flood's time from A's first create to its last
// completion.
func floodRun(ctx context.Context, env *Env, size Size, flood, withB bool) (Measurement, bTurns, time.Duration, error) {
	n := 0
	if flood {
		n = size.N
	}
	fr, err := startFairRunner(ctx, env, n)
	if err != nil {
		return Measurement{}, bTurns{}, 0, err
	}
	defer fr.stop()
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, bTurns{}, 0, err
	}
	start := time.Now()
	type ticked struct {
		bTurns
		err error
	}
	bDone := make(chan ticked, 1)
	stopB := make(chan struct{})
	if withB {
		bMax, until := min(fairAlone, size.N), (<-chan struct{})(nil)
		if flood {
			bMax, until = size.N, stopB // until the flood is done
		}
		go func() {
			lat, before, err := fr.ticker(ctx, "b", 0, bMax, until)
			bDone <- ticked{bTurns{lat, before}, err}
		}()
	}
	var floodTook time.Duration
	if flood {
		if err := createTenantNoops(ctx, env, fr.eng, "a", "a", 0, n); err != nil {
			close(stopB)
			return Measurement{}, bTurns{}, 0, fmt.Errorf("create: %w", err)
		}
		select {
		case <-fr.done:
		case <-ctx.Done():
			close(stopB)
			return Measurement{}, bTurns{}, 0, fmt.Errorf("%w: %d of %d tasks completed (%s): %w", errUnfinished, fr.completed.Load(), n,
				leftBehind(ctx, env), ctx.Err())
		}
		floodTook = time.Since(start)
	}
	close(stopB)
	var b bTurns
	if withB {
		t := <-bDone
		if t.err != nil {
			return Measurement{}, bTurns{}, 0, fmt.Errorf("tenant b: %w", t.err)
		}
		b = t.bTurns
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, bTurns{}, 0, err
	}
	m.Elapsed = end.Sub(start)
	return m, b, floodTook, nil
}

// bTurns are tenant B's turns' start latencies, and their parts before
// the transaction that started each (fairRunner.ticker).
type bTurns struct{ lat, before []time.Duration }

// fairLatencyFlood is (m)'s "flood": B's start latencies beside A's flood.
func fairLatencyFlood(ctx context.Context, env *Env, size Size) (Measurement, error) {
	m, b, took, err := floodRun(ctx, env, size, true, true)
	if err != nil {
		return m, err
	}
	m.Latencies = b.lat
	m.Note = fmt.Sprintf("B created %d turns while A's flood of %d ran; the flood took %s (%.0f tasks/s); B's latency %s",
		len(b.lat), size.N, took.Round(time.Millisecond), float64(size.N)/took.Seconds(), partsText(b.lat, b.before))
	return m, nil
}

// fairLatencyAlone is (m)'s "alone": B's start latencies with no flood.
func fairLatencyAlone(ctx context.Context, env *Env, size Size) (Measurement, error) {
	m, b, _, err := floodRun(ctx, env, size, false, true)
	m.Latencies = b.lat
	if err == nil {
		m.Note = "B's latency " + partsText(b.lat, b.before)
	}
	return m, err
}

// fairThroughputWithB is (n)'s "with-b": A's flood beside B's turns; the
// figure is A's tasks/s.
func fairThroughputWithB(ctx context.Context, env *Env, size Size) (Measurement, error) {
	m, b, took, err := floodRun(ctx, env, size, true, true)
	if err != nil {
		return m, err
	}
	m.Elapsed = took
	m.Note = fmt.Sprintf("B's %d turns beside the flood: start latency p50 %s, p99 %s", len(b.lat),
		percentile(b.lat, 0.5).Round(100*time.Microsecond), percentile(b.lat, 0.99).Round(100*time.Microsecond))
	return m, nil
}

// fairThroughputAlone is (n)'s "alone": A's flood with no B.
func fairThroughputAlone(ctx context.Context, env *Env, size Size) (Measurement, error) {
	m, _, took, err := floodRun(ctx, env, size, true, false)
	m.Elapsed = took
	return m, err
}

// priorityRun is one run of (o): a backlog of size.N background turns
// (priority 0) created before the runner starts (when backlog), then
// interactive turns (priority 60) every fairTick while the backlog drains
// (or fairAlone of them with none); it returns their start latencies.
func priorityRun(ctx context.Context, env *Env, size Size, backlog bool) (Measurement, error) {
	n := 0
	if backlog {
		n = size.N
		// The backlog is created by an engine of its own, before the
		// runner starts: not timed.
		pool, eng, err := machinePool(ctx, env)
		if err != nil {
			return Measurement{}, err
		}
		err = createTenantNoops(ctx, env, eng, "bg", "", 0, n)
		pool.Close()
		if err != nil {
			return Measurement{}, fmt.Errorf("create the backlog: %w", err)
		}
	}
	fr, err := startFairRunner(ctx, env, n)
	if err != nil {
		return Measurement{}, err
	}
	defer fr.stop()
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	limit, until := min(fairAlone, size.N), (<-chan struct{})(nil)
	if backlog {
		limit, until = size.N, fr.done // until the backlog is drained
	}
	lat, before, err := fr.ticker(ctx, "", interactivePriority, limit, until)
	if err != nil {
		return Measurement{}, fmt.Errorf("interactive turns: %w", err)
	}
	select {
	case <-fr.done:
	case <-ctx.Done():
		return Measurement{}, fmt.Errorf("%w: %d of %d background tasks completed (%s): %w", errUnfinished, fr.completed.Load(), n,
			leftBehind(ctx, env), ctx.Err())
	}
	end := time.Now()
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	m.Elapsed = end.Sub(start)
	m.Latencies = lat
	m.Note = "latency " + partsText(lat, before)
	if backlog {
		m.Note = fmt.Sprintf("%d interactive turns created while the backlog of %d drained; %s", len(lat), n, m.Note)
	}
	return m, nil
}

func priorityBacklog(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return priorityRun(ctx, env, size, true)
}

func priorityEmpty(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return priorityRun(ctx, env, size, false)
}
