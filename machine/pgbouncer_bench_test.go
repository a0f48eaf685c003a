package machine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// BenchmarkRunnerPgBouncer runs agent turns (a turn, three tool calls,
// all_settled) through one Runner whose engine is on a direct pool, then
// on a pool through PgBouncer in transaction mode (with a direct
// ListenPool), in the same run: turns/s of each and their ratio are
// docs/scaling.md's figure.
//
//	scripts/with-postgres.sh go test ./machine -run '^$' -bench RunnerPgBouncer -benchtime=1x
func BenchmarkRunnerPgBouncer(b *testing.B) {
	const turns = 500
	rates := map[string]float64{}
	for _, via := range []string{"direct", "pgbouncer"} {
		b.Run(via, func(b *testing.B) {
			bd := setup(b)
			cfg := &tasks.Config{Schema: bd.schema}
			pool := bd.pool
			if via == "pgbouncer" {
				pool = testdb.PgBouncerPool(b, testdb.Name("bench"))
				cfg.TransactionPooler, cfg.ListenPool = true, bd.pool
			}
			eng := enginetest.New(b, pool, cfg)
			for range b.N {
				prefix := testdb.Name("turns")
				for i := range turns {
					_, _, err := eng.Create(bd.ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%d", prefix, i), Kind: "turn"})
					require.NoError(b, err)
				}
				start := time.Now()
				r, err := machine.NewRunner(eng.Engine, benchTurn(), &machine.RunnerConfig{
					Waker: &machine.WakerConfig{RiverTestOnly: true}})
				require.NoError(b, err)
				require.NoError(b, r.Start(bd.ctx))
				for done := 0; done < turns; {
					time.Sleep(10 * time.Millisecond)
					require.NoError(b, bd.pool.QueryRow(bd.ctx, `SELECT count(*) FROM `+bd.schema+`.tasks
						WHERE kind = 'turn' AND status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned') AND conversation_id LIKE $1 || '-%'`, prefix).Scan(&done))
				}
				var failed int
				require.NoError(b, bd.pool.QueryRow(bd.ctx, `SELECT count(*) FROM `+bd.schema+`.tasks
					WHERE status <> 'completed' AND conversation_id LIKE $1 || '-%'`, prefix).Scan(&failed))
				require.Zero(b, failed, "every turn and tool call completed")
				elapsed := time.Since(start)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				require.NoError(b, r.Stop(ctx))
				cancel()
				rates[via] = turns / elapsed.Seconds()
				b.ReportMetric(rates[via], "turns/s")
			}
		})
	}
	if rates["direct"] > 0 && rates["pgbouncer"] > 0 {
		b.Logf("through PgBouncer: %.0f turns/s; direct: %.0f turns/s; ratio %.2f", rates["pgbouncer"], rates["direct"], rates["pgbouncer"]/rates["direct"])
	}
}

// benchTurn is a turn of three parallel tool calls.
func benchTurn() map[string]machine.Handler {
	return map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				return run.Complete(ctx, nil)
			}
			kids, err := run.SpawnMany(ctx, []machine.SpawnParams{{Kind: "tool"}, {Kind: "tool"}, {Kind: "tool"}})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{kids[0].ID, kids[1].ID, kids[2].ID}, Policy: arbortype.AllSettled, Phase: "gathering"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, nil) },
	}
}
