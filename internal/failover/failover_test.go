package failover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/machine"
)

// failover is a fault of the primary: it starts the fault and returns the
// moment it did (by this process's clock, which is the servers' too). The
// scenario then waits for the monitor to promote the standby, and calls
// after, if not nil (to heal what the fault cut, and let the old primary
// rejoin as a standby).
type failover struct {
	name  string
	fault func(s *scenario, old string) time.Time
	after func(s *scenario, old string)
}

// killed: the primary's machine dies — its keeper and its PostgreSQL
// (postmaster and backends) SIGKILLed at once — and, once the standby is
// promoted, comes back: its keeper restarts it, and it rejoins as the new
// primary's standby (pg_rewind).
var killed = failover{
	name: "primary SIGKILLed",
	fault: func(s *scenario, old string) time.Time {
		at := time.Now()
		s.cluster.do("kill", old)
		return at
	},
	after: func(s *scenario, old string) { s.cluster.do("start", old) },
}

// progress is the workload's state at the fault: enough handler calls
// made, and tasks sleeping and awaiting, so that the failover finds work
// in every state.
func (s *scenario) waitUnderWay(calls int) {
	s.T.Helper()
	s.WaitFor(fmt.Sprintf("%d handler calls and tasks asleep and awaiting", calls), func() bool {
		// An await parks its task sleeping, as a sleep does.
		return s.Runs() >= calls && s.Count(`SELECT count(*) FROM {s}.tasks WHERE status = 'sleeping' AND kind = 'nap'`) > 0 &&
			s.Count(`SELECT count(*) FROM {s}.tasks WHERE status = 'sleeping' AND kind = $1`, faultharness.AgentKind) > 0
	})
	require.False(s.T, s.Done(), "the work was done before the fault; the workload is too small")
}

// run is a scenario's course: the fault once the workload is under way
// (at wait, if given, instead), the approvals still due emitted through
// the failover, followers and a client's calls timed across it, then the
// proof and the figures.
func (s *scenario) run(f failover, wait func()) faultharness.Figures {
	t := s.T
	t.Helper()
	fol := s.follow(s.Turns[:20])
	if wait == nil {
		s.waitUnderWay(400)
	} else {
		wait()
	}
	live := s.Live()
	probe := s.startProbe()
	old := s.primary
	faultAt := f.fault(s, old)
	var emitted sync.WaitGroup
	var emitErr error
	emitted.Add(1)
	go func() { defer emitted.Done(); emitErr = s.EmitRest() }()
	promoted := s.cluster.promoted(old)
	promotedAt := time.Now()
	t.Logf("%s: the fault at %s with %d tasks live; %s promoted %.1f s after it (seen on the monitor)",
		f.name, faultAt.Format("15:04:05.000"), live, promoted, promotedAt.Sub(faultAt).Seconds())
	if f.after != nil {
		f.after(s, old)
	}
	emitted.Wait()
	require.NoError(t, emitErr, "the approvals emitted through the failover")
	s.WaitSettled()
	// Before the runners stop: do they LISTEN on the new primary?
	listening := s.listeners()
	lag, hanging, ferrs := s.followerLag(fol)
	calls := probe.stop()
	s.stopAll()
	fig := s.Verify()
	s.Fault("failover", "", "", faultAt, promotedAt)

	newPort := s.cluster.ports[promoted]
	var first, last *time.Time
	s.Retry("first completed on the new primary", func(ctx context.Context) error {
		return s.Pool.QueryRow(ctx, s.Q(`SELECT min(at) FILTER (WHERE new_status = 'completed' AND server_port = $1 AND at > $2),
				max(at) FILTER (WHERE new_status IN ('completed', 'failed', 'cancelled', 'aborted', 'orphaned'))
			FROM {s}.chaos_audit`), newPort, faultAt).Scan(&first, &last)
	})
	require.NotNil(t, first, "a task completed on the new primary")
	var onOld, riverAfter int
	onOld = s.Count(`SELECT count(*) FROM {s}.chaos_audit WHERE server_port IS DISTINCT FROM $1 AND at > $2`, newPort, promotedAt)
	riverAfter = s.Count(`SELECT count(*) FROM {s}.river_job WHERE state = 'completed' AND finalized_at > $1`, faultAt)
	timers, rivers := s.wakesAfter(faultAt)

	t.Logf("%s: fault → first task completed on the new primary (%s): %.2f s; → every conversation settled: %.2f s",
		f.name, promoted, first.Sub(faultAt).Seconds(), last.Sub(faultAt).Seconds())
	t.Logf("%s: a client's calls (Engine.Get, every 100 ms, the engine's defaults): %s", f.name, calls)
	t.Logf("%s: %d followers (AwaitSettled) returned, at most %s after their turn settled; %d left hanging; errors seen and retried: %v",
		f.name, len(fol.turns)-hanging, lag.Round(time.Millisecond), hanging, ferrs)
	t.Logf("%s: after the fault, %d wakes by the runners' timers and %d by River's jobs (%d wake jobs completed on River after it); runners LISTENing on the new primary at the end: %v",
		f.name, timers, rivers, riverAfter, listening)
	assert.Zero(t, onOld, "no row version written on the old primary after the promotion (split brain)")
	assert.Zero(t, hanging, "no follower left hanging")
	for _, n := range s.nodes {
		assert.Positive(t, listening[n.name], "runner %s LISTENs on the new primary", n.name)
	}
	assert.Zero(t, fig.Restarts, "no restart counted")
	assert.Zero(t, fig.Attempts, "every task's attempt stays 0")
	assert.Zero(t, fig.FailedByFault, "no task failed by the failover")
	assert.Zero(t, fig.Overlaps["overlap"], "no two calls of a task at once")
	// The cluster back to a primary and its synchronous standby, for the
	// next scenario.
	s.cluster.healthy()
	return fig
}

// listeners counts each runner's LISTEN sessions on the server the pool
// reaches now: the new primary.
func (s *scenario) listeners() map[string]int {
	out := map[string]int{}
	for _, n := range s.nodes {
		out[n.name] = s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'`, appPrefix+n.name)
	}
	return out
}

// wakesAfter counts the wakes the runners committed after at, by their
// local timers and by River's jobs.
func (s *scenario) wakesAfter(at time.Time) (timers, rivers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.wakes {
		if w.at.After(at) {
			switch w.by {
			case machine.WokenByTimer:
				timers++
			case machine.WokenByRiver:
				rivers++
			}
		}
	}
	return timers, rivers
}

// probe is a client of the application's: an Engine.Get every 100 ms on
// the test's engine, at its defaults (UnavailableTimeout 30 s), timed —
// what a user's call sees during the failover.
type probe struct {
	stopped chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	longest time.Duration
	calls   int
	errs    map[string]int
}

func (s *scenario) startProbe() *probe {
	p := &probe{stopped: make(chan struct{}), done: make(chan struct{}), errs: map[string]int{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stopped:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(s.Ctx, 2*time.Minute)
			began := time.Now()
			_, err := s.Engine.Get(ctx, s.Turns[0])
			took := time.Since(began)
			cancel()
			p.mu.Lock()
			p.calls++
			p.longest = max(p.longest, took)
			if err != nil {
				kind := "other"
				switch {
				case errors.Is(err, arbortype.ErrUnavailable):
					kind = "ErrUnavailable"
				case errors.Is(err, arbortype.ErrAmbiguous):
					kind = "ErrAmbiguous"
				}
				p.errs[kind+": "+err.Error()]++
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// stop ends the probe and describes its calls.
func (p *probe) stop() string {
	close(p.stopped)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []string
	for e, n := range p.errs {
		errs = append(errs, fmt.Sprintf("%d × %s", n, e))
	}
	return fmt.Sprintf("%d calls, the longest %.2f s, errors: [%s]", p.calls, p.longest.Seconds(), strings.Join(errs, "; "))
}
