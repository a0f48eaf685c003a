package chaos

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/tasks"
)

// envKeepLogs names a folder to keep the runner processes' logs in, with
// the run log, the audit and the tasks as CSV (one folder per test); by
// default the logs go to the test's temporary folder, and the tables with
// its schema.
const envKeepLogs = "ARBOR_CHAOS_LOGS"

// envSeed sets the seed of the moments of the faults (a number of handler
// calls after the last one), to run a scenario again as it was logged.
const envSeed = "ARBOR_CHAOS_SEED"

// scenario is the fault harness's scenario (internal/faultharness: the
// schema with the run log, the side effects, the faults and the audit
// trigger, the test's engine and pool, the turns, the proof) with what
// this suite adds: the seed of its faults' moments and the runner
// processes it started.
type scenario struct {
	*faultharness.Scenario
	rng      *rand.Rand
	children []*child
}

// setup gives a test a scenario (faultharness.New) and creates
// conversations turns of the tree workload, one turn each. The tests do
// not run in parallel (no t.Parallel): one of them restarts the database
// server, which would hit every other test sharing it, and on a two-core
// machine parallel runner processes would starve each other into lease
// losses that belong to no scenario.
//
// Every task is created with the engine's default restart limit
// (tasks.RestartLimitDefault): the proof accepts a task failed by it only
// when kills and freezes really cut its runs more often (see
// faultharness.Scenario.Verify).
func setup(t *testing.T, conversations int) *scenario {
	return setupWith(t, conversations, faultharness.Config{}, nil)
}

// setupWith is setup with the workload's tenants and tool key of cfg
// (its other fields are the suite's own), and before, when not nil, run
// on the scenario before the turns are created (limits, weights).
func setupWith(t *testing.T, conversations int, cfg faultharness.Config, before func(s *scenario)) *scenario {
	requireChaos(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSeed); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, envSeed)
	}
	t.Logf("seed %d (%s=%d makes the faults come at the same counts of handler calls)", seed, envSeed, seed)
	s := &scenario{
		Scenario: faultharness.New(t, faultharness.Config{AppPrefix: appPrefix, Conversations: "chaos", KeepLogsEnv: envKeepLogs,
			Tenants: cfg.Tenants, ToolKey: cfg.ToolKey}),
		rng: rand.New(rand.NewPCG(seed, seed>>1)),
	}
	require.Equal(t, tasks.RestartLimitDefault, s.Engine.Config().RestartLimit, "the workload runs at the engine's default restart limit")
	if before != nil {
		before(s)
	}
	s.AddTurns(conversations, nil)
	return s
}

// stopAll stops every runner process still alive, gracefully.
func (s *scenario) stopAll() {
	s.T.Helper()
	for _, c := range s.children {
		select {
		case <-c.done:
		default:
			s.stop(c)
		}
	}
}
