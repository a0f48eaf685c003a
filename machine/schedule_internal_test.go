package machine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Two runners on one schema, a schedule every second with a conversation
// per tick: the runners' maintenance (its leader) fires the ticks, the
// runners run the turns, and every tick has exactly one turn.
func TestRunnersFireASchedule(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ran := make(chan string, 100)
	for _, node := range []string{"node-a", "node-b"} {
		r, err := NewRunner(eng.Engine, map[string]Handler{"tick": func(_ context.Context, run *Run) error {
			ran <- run.Task.ConversationID
			return nil
		}}, &RunnerConfig{
			NodeID:            node,
			ConversationLease: 3 * time.Second,
			PollInterval:      20 * time.Millisecond,
			ShutdownGrace:     time.Second,
			Logger:            slog.New(slog.DiscardHandler),
			Waker:             &WakerConfig{RiverTestOnly: true},
		})
		require.NoError(t, err)
		require.NoError(t, r.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, r.Stop(ctx))
		})
	}
	ctx := context.Background()
	_, err := eng.CreateSchedule(ctx, arbortype.ScheduleParams{Name: "beat", Kind: "tick", Every: time.Second, Tenant: "acme"})
	require.NoError(t, err)

	seen := map[string]bool{}
	deadline := time.After(eventually)
	for len(seen) < 3 {
		select {
		case conv := <-ran:
			require.False(t, seen[conv], "tick %s ran twice", conv)
			seen[conv] = true
		case <-deadline:
			t.Fatalf("timed out waiting for three ticks; ran %v", seen)
		}
	}
	_, err = eng.PauseSchedule(ctx, "beat")
	require.NoError(t, err)
	var ticks, turns int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT conversation_id), count(*) FROM `+schema+`.tasks
		WHERE owner_task_id IS NULL AND tenant = 'acme' AND idempotency_key LIKE 'arbor:schedule:beat:%'`).Scan(&ticks, &turns))
	require.Equal(t, ticks, turns, "one turn per tick")
	require.GreaterOrEqual(t, turns, 3)
}
