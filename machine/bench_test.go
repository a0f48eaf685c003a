package machine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// BenchmarkWakeLateness measures how late sleeps wake: 1,000 sleeps of 0.1
// to 10 s (uniform), spread over 50 conversations, with the waker's timers
// on and with River alone, in the same run. Lateness is the time from a
// sleep's wake time to the commit of its wake (when the waker reports it),
// so it includes the wake transaction. Each mode reports p50, p99 and max in
// milliseconds, and how many sleeps River woke. One iteration takes ~10 s
// per mode; run it with -benchtime=1x:
//
//	scripts/with-postgres.sh go test ./machine -run '^$' -bench WakeLateness -benchtime=1x
func BenchmarkWakeLateness(b *testing.B) {
	for _, mode := range []struct {
		name   string
		timers bool
	}{{"timers", true}, {"river_alone", false}} {
		b.Run(mode.name, func(b *testing.B) {
			var (
				lateness  []time.Duration
				riverWoke int
			)
			for range b.N {
				l, r := measureLateness(b, mode.timers, 1000)
				lateness = append(lateness, l...)
				riverWoke += r
			}
			slices.Sort(lateness)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(lateness[len(lateness)/2]), "p50_ms")
			b.ReportMetric(ms(lateness[len(lateness)*99/100]), "p99_ms")
			b.ReportMetric(ms(lateness[len(lateness)-1]), "max_ms")
			b.ReportMetric(float64(riverWoke)/float64(b.N), "river_wakes/op")
		})
	}
}

func measureLateness(b *testing.B, timers bool, sleeps int) ([]time.Duration, int) {
	b.StopTimer()
	bd := setup(b)
	const conversations = 50
	convs := make([]string, conversations)
	for i := range convs {
		convs[i] = fmt.Sprintf("%s_%d", bd.conv, i)
	}
	b.Cleanup(func() {
		for _, c := range convs {
			require.Empty(b, bd.engine.SleepViolations(b, context.Background(), c))
		}
	})

	var (
		mu     sync.Mutex
		wakeAt = map[int64]time.Time{}
		wokeAt = map[int64]time.Time{}
		wokeBy = map[int64]machine.WakeSource{}
	)
	onWake := func(ev machine.Wake) {
		now := time.Now()
		mu.Lock()
		wokeAt[ev.TaskID], wokeBy[ev.TaskID] = now, ev.By
		mu.Unlock()
	}
	// Production settings: River's defaults, the waker's defaults.
	w, err := machine.NewWaker(bd.engine.Engine, &machine.WakerConfig{DisableTimers: !timers, OnWake: onWake})
	require.NoError(b, err)
	require.NoError(b, w.Start(bd.ctx))
	defer func() { require.NoError(b, w.Stop(context.Background())) }()

	// Warm up: a due sleep is woken once River's client is working.
	warm := sleepIn(b, bd, convs[0], -time.Millisecond)
	require.Eventually(b, func() bool { return bd.status(b, warm.ID) == arbortype.StatusPending }, eventually, 10*time.Millisecond)

	b.StartTimer()
	var wg sync.WaitGroup
	work := make(chan string)
	for range 8 {
		wg.Go(func() {
			for conv := range work {
				task := sleepIn(b, bd, conv, 100*time.Millisecond+rand.N(9900*time.Millisecond))
				mu.Lock()
				wakeAt[task.ID] = *task.WakeAt
				mu.Unlock()
			}
		})
	}
	for i := range sleeps {
		work <- convs[i%conversations]
	}
	close(work)
	wg.Wait()
	allWoken := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range wakeAt {
			if _, ok := wokeAt[id]; !ok {
				return false
			}
		}
		return true
	}
	require.Eventually(b, allWoken, 2*eventually, 20*time.Millisecond, "every sleep wakes")
	b.StopTimer()

	mu.Lock()
	defer mu.Unlock()
	out := make([]time.Duration, 0, len(wakeAt))
	byRiver := 0
	for id, at := range wakeAt {
		out = append(out, wokeAt[id].Sub(at))
		if wokeBy[id] == machine.WokenByRiver {
			byRiver++
		}
	}
	return out, byRiver
}

// sleepIn creates and starts a task in conv and puts it to sleep for d.
func sleepIn(b *testing.B, bd *bundle, conv string, d time.Duration) arbortype.Task {
	task, _, err := bd.engine.Create(bd.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "bench"})
	require.NoError(b, err)
	task, err = bd.engine.Start(bd.ctx, task.ID)
	require.NoError(b, err)
	task, err = bd.engine.SleepUntil(bd.ctx, task.ID, task.Token, time.Now().Add(d), "bench", nil)
	require.NoError(b, err)
	return task
}
