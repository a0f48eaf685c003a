package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Scenario (i): what an agent backend waits on, through a machine.Runner
// with RunnerConfig{}. N operations over agentConvs conversations, one at a
// time per conversation; each latency is counted from the return of the
// call that committed the change (a handler's Complete, an Emit, a
// handler's Progress) to the moment the other side saw it.

// agentConvs is how many conversations the N operations of (i) spread over.
const agentConvs = 10

// awaitSettledLatency: a turn completes in its handler; a caller outside the
// runner waits for it with AwaitSettled. Latency: AwaitSettled's return
// minus the return of the handler's Complete (both after the commit; 0 when
// AwaitSettled returned first).
func awaitSettledLatency(ctx context.Context, env *Env, size Size) (Measurement, error) {
	var mu sync.Mutex
	completed := map[int64]time.Time{}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if err := run.Complete(ctx, nil); err != nil {
				return err
			}
			mu.Lock()
			completed[run.Task.ID] = time.Now()
			mu.Unlock()
			return nil
		},
	}
	return agentLoop(ctx, env, size, handlers, func(ctx context.Context, eng *tasks.Engine, conv string) (time.Duration, error) {
		turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		if err != nil {
			return 0, err
		}
		got, err := eng.AwaitSettled(ctx, turn.ID)
		seen := time.Now()
		if err != nil {
			return 0, err
		}
		if got.Status != arbortype.StatusCompleted {
			return 0, fmt.Errorf("turn %d is %s", turn.ID, got.Status)
		}
		mu.Lock()
		at, ok := completed[turn.ID]
		mu.Unlock()
		if !ok {
			return 0, nil // AwaitSettled returned before the handler's Complete did
		}
		return max(0, seen.Sub(at)), nil
	})
}

// emitLatency: a turn awaits an event; the caller emits it. Latency: the
// handler's re-entry minus the Emit's return.
func emitLatency(ctx context.Context, env *Env, size Size) (Measurement, error) {
	var mu sync.Mutex
	parked := map[string]chan int64{}
	entered := map[int64]chan time.Time{}
	chans := func(conv string) chan int64 {
		mu.Lock()
		defer mu.Unlock()
		if parked[conv] == nil {
			parked[conv] = make(chan int64, 1)
		}
		return parked[conv]
	}
	entry := func(id int64) chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		if entered[id] == nil {
			entered[id] = make(chan time.Time, 1)
		}
		return entered[id]
	}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "woken" {
				entry(run.Task.ID) <- time.Now()
				return run.Complete(ctx, nil)
			}
			err := run.AwaitEvent(ctx, machine.AwaitParams{Name: "go", Phase: "woken"})
			if err == nil {
				chans(run.Task.ConversationID) <- run.Task.ID
			}
			return err
		},
	}
	return agentLoop(ctx, env, size, handlers, func(ctx context.Context, eng *tasks.Engine, conv string) (time.Duration, error) {
		turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		if err != nil {
			return 0, err
		}
		select {
		case <-chans(conv):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		_, _, err = eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, TaskID: turn.ID, Name: "go"})
		emitted := time.Now()
		if err != nil {
			return 0, err
		}
		select {
		case at := <-entry(turn.ID):
			if _, err := eng.AwaitSettled(ctx, turn.ID); err != nil {
				return 0, err
			}
			return max(0, at.Sub(emitted)), nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
}

// streamLatency: a handler publishes a progress entry; a follower of the
// conversation receives it. Latency: the follower's receipt minus the
// return of the handler's Progress.
func streamLatency(ctx context.Context, env *Env, size Size) (Measurement, error) {
	var mu sync.Mutex
	published := map[int64]time.Time{}
	handlers := map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if err := run.Progress(ctx, "token", json.RawMessage(`"hi"`)); err != nil {
				return err
			}
			mu.Lock()
			published[run.Task.ID] = time.Now()
			mu.Unlock()
			return run.Complete(ctx, nil)
		},
	}
	return agentLoop(ctx, env, size, handlers, func(ctx context.Context, eng *tasks.Engine, conv string) (time.Duration, error) {
		head, err := eng.LogHead(ctx, conv)
		if err != nil && !errors.Is(err, arbortype.ErrNotFound) {
			return 0, err
		}
		turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		if err != nil {
			return 0, err
		}
		var seen time.Time
		stop := errors.New("seen")
		err = eng.Follow(ctx, conv, head, func(en arbortype.LogEntry) error {
			if en.Kind == arbortype.LogKindProgress && en.TaskID == turn.ID {
				seen = time.Now()
			}
			if en.TaskID == turn.ID && en.Terminal() {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) {
			return 0, err
		}
		mu.Lock()
		at := published[turn.ID]
		mu.Unlock()
		return max(0, seen.Sub(at)), nil
	})
}

// agentLoop runs a runner with handlers and, on agentConvs goroutines (one
// conversation each), op until N operations are done; it collects their
// latencies.
func agentLoop(ctx context.Context, env *Env, size Size, handlers map[string]machine.Handler,
	op func(ctx context.Context, eng *tasks.Engine, conv string) (time.Duration, error)) (Measurement, error) {
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
	var mu sync.Mutex
	var lat []time.Duration
	convs := min(agentConvs, size.N)
	err = parallel(ctx, convs, convs, func(ctx context.Context, c int) error {
		conv := fmt.Sprintf("agent-%d", c)
		for i := c; i < size.N; i += convs {
			d, err := op(ctx, eng, conv)
			if err != nil {
				return err
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
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
	m.Elapsed = end.Sub(start)
	m.Latencies = lat
	return m, nil
}
