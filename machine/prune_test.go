package machine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// A runner's node runs the periodic prune job: River's leader inserts it
// at its start, and the prune worker completes it.
func TestRunnerRunsThePruneJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, Retention: time.Hour})
	require.NoError(t, err)
	runner, err := machine.NewRunner(engine, map[string]machine.Handler{"turn": func(ctx context.Context, run *machine.Run) error { return nil }}, nil)
	require.NoError(t, err)
	require.NoError(t, runner.Start(ctx))
	t.Cleanup(func() { require.NoError(t, runner.Stop(ctx)) })
	// Waited for by its outcome: River's leader election and the job's
	// insert take their own time on a busy machine.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.river_job WHERE kind = 'arbor_prune' AND state = 'completed'`).Scan(&n))
		return n > 0
	}, 2*time.Minute, 20*time.Millisecond)
}
