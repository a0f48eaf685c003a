package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/tasks"
)

// TestPrimaryKilled (1): the primary's machine dies with the workload
// under way (its keeper and PostgreSQL SIGKILLed); the monitor promotes the
// standby once the primary fails its health checks and its demote timeout
// passed; the old primary comes back as the new one's standby.
func TestPrimaryKilled(t *testing.T) {
	s := setup(t, options{})
	s.AddTurns(conversations, nil)
	s.run(killed, nil)
}

// TestSwitchover (2): a planned switchover (`pg_autoctl perform
// switchover`): the primary drains and is demoted, the standby promoted,
// the old primary follows it. The runners' local timers are off: every
// sleep and await timeout is woken by River's jobs, so that River not
// coming back on the new primary would leave tasks asleep.
func TestSwitchover(t *testing.T) {
	s := setup(t, options{riverOnly: true})
	s.AddTurns(conversations, nil)
	s.run(failover{
		name: "planned switchover",
		fault: func(s *scenario, _ string) time.Time {
			at := time.Now()
			go func() {
				// It waits for the switchover's end, which run waits for on
				// the monitor. Off the test's goroutine, it reports with
				// Errorf, never FailNow.
				if err := s.cluster.switchover(); err != nil {
					s.T.Errorf("%v", err)
				}
			}()
			return at
		},
	}, nil)
}

// TestPrimaryCut (3): the primary's network cut — its keeper's route to the
// monitor first, then every TCP connection to it refused and its clients'
// and walsenders' backends terminated — until the monitor promotes the
// standby; then healed, and the old primary (which demoted itself on the
// partition) rejoins as a standby. The runners' timers are off, as in (2):
// River alone wakes the sleeps, after an unplanned failover this time.
func TestPrimaryCut(t *testing.T) {
	if os.Getenv(envCut) == "" {
		t.Skip("CUT TEST SKIPPED: cutting a node's network needs scripts/with-failover-cluster.sh run as root, in a network namespace of its own (iptables)")
	}
	s := setup(t, options{riverOnly: true})
	s.AddTurns(conversations, nil)
	s.run(failover{
		name: "primary's network cut",
		fault: func(s *scenario, old string) time.Time {
			at := time.Now()
			s.cluster.do("cut", old)
			return at
		},
		after: func(s *scenario, old string) {
			if out := strings.TrimSpace(s.cluster.do("heal", old)); out != "" {
				s.T.Logf("heal: %s", out)
			}
		},
	}, nil)
}

// TestKilledDuringFlush (4): the primary killed as soon as a runner's
// completer flush is in flight, one that inserts the leaves of a big
// fan-out (one turn in three spawns 50 to 200 leaves in one SpawnMany):
// seen in pg_stat_activity on the primary, polled every 2 ms.
func TestKilledDuringFlush(t *testing.T) {
	s := setup(t, options{})
	s.AddTurns(conversations, func(i int) int {
		if i%3 != 0 {
			return 0
		}
		return 50 + (i*37)%151
	})
	var inFlush bool
	s.run(failover{name: "primary SIGKILLed during a flush", fault: killed.fault, after: killed.after}, func() {
		s.waitUnderWay(150)
		deadline := time.Now().Add(faultharness.WaitWithin)
		for !inFlush && time.Now().Before(deadline) && !s.Done() {
			inFlush = s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '`+appPrefix+`%'
				AND xact_start IS NOT NULL AND state <> 'idle' AND query ILIKE '%INSERT INTO %.tasks AS t%SELECT v.conv, nullif(v.owner, 0)%'`) > 0
			if !inFlush {
				time.Sleep(2 * time.Millisecond) // a poll of pg_stat_activity
			}
		}
		require.True(t, inFlush, "a flush with a spawn insert was seen in flight")
	})
	t.Logf("(4) the primary was killed 2 ms or less after a runner's flush was seen inserting spawned tasks")
}

// TestKilledDuringPrune (5): the primary killed while the prune deletes a
// history of 500 settled conversations (Engine.Prune, 20 tasks a
// transaction), as soon as a prune transaction is seen in flight; the
// prune is called again after the failover until that history is gone,
// and nothing of the live workload was pruned.
func TestKilledDuringPrune(t *testing.T) {
	s := setup(t, options{})
	const aged = 500
	s.addAged(aged)
	// The cutoff: after every aged conversation settled, before the live
	// ones were created.
	var cutoff time.Time
	s.Retry("cutoff", func(ctx context.Context) error { return s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&cutoff) })
	s.WaitFor("the server's clock past the cutoff", func() bool {
		var now time.Time
		s.Retry("now", func(ctx context.Context) error { return s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&now) })
		return now.After(cutoff.Add(500 * time.Millisecond))
	})
	s.AddTurns(conversations, nil)
	pruner, err := tasks.New(s.Ctx, s.namedPool("fo-prune"), &tasks.Config{Schema: s.Schema})
	require.NoError(t, err)
	// A prune still in flight when the test fails (its server killed half
	// way, say) is cut first: registered after its pool's Close, this
	// cleanup runs before it, which would otherwise wait for the prune's
	// connection until the package's timeout.
	pruneCtx, cancelPrune := context.WithCancel(s.Ctx)
	t.Cleanup(cancelPrune)
	var (
		pruned   tasks.PruneResult
		pruneErr error
		wg       sync.WaitGroup
	)
	prune := func() (tasks.PruneResult, error) {
		var olderThan time.Duration
		s.Retry("older than", func(ctx context.Context) error {
			var secs float64
			err := s.Pool.QueryRow(ctx, `SELECT extract(epoch FROM now() - $1::timestamptz)`, cutoff).Scan(&secs)
			olderThan = time.Duration(secs * float64(time.Second))
			return err
		})
		return pruner.Prune(pruneCtx, tasks.PruneParams{OlderThan: olderThan, Batch: 20})
	}
	s.run(failover{name: "primary SIGKILLed during a prune", fault: killed.fault, after: killed.after}, func() {
		s.waitUnderWay(200)
		wg.Add(1)
		go func() { defer wg.Done(); pruned, pruneErr = prune() }()
		s.WaitFor("a prune transaction in flight", func() bool {
			return s.Count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fo-prune'
				AND xact_start IS NOT NULL AND state <> 'idle'`) > 0
		})
	})
	wg.Wait()
	t.Logf("(5) the prune cut by the failover returned %+v, error %v", pruned, pruneErr)
	for range 10 {
		if s.Count(`SELECT count(*) FROM {s}.conversations WHERE id LIKE 'aged-%'`) == 0 {
			break
		}
		again, err := prune()
		t.Logf("(5) pruned again: %+v, error %v", again, err)
	}
	require.Zero(t, s.Count(`SELECT count(*) FROM {s}.conversations WHERE id LIKE 'aged-%'`), "the aged history is gone")
	require.Zero(t, s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id LIKE 'aged-%'`), "the aged history is gone")
}

// addAged creates n conversations of one "done" task each, and waits until
// every one settled: a history for the prune.
func (s *scenario) addAged(n int) {
	s.T.Helper()
	var ps []arbortype.CreateParams
	for i := range n {
		in, _ := json.Marshal(map[string]any{"value": map[string]any{"name": "aged"}})
		ps = append(ps, arbortype.CreateParams{ConversationID: fmt.Sprintf("aged-%04d", i), Kind: faultharness.DoneKind, Input: in, IdempotencyKey: "aged"})
	}
	for len(ps) > 0 {
		k := min(100, len(ps))
		s.Retry("create aged", func(ctx context.Context) error {
			_, _, err := s.Engine.CreateMany(ctx, ps[:k])
			return err
		})
		ps = ps[k:]
	}
	s.WaitFor("the aged conversations settled", func() bool {
		return s.Count(`SELECT count(*) FROM {s}.tasks WHERE conversation_id LIKE 'aged-%' AND status = 'completed'`) == n
	})
}
