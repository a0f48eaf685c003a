package core_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// BenchmarkAbortSubtree aborts a tree of about 1,000 and about 10,000 tasks
// at its root and reports the cost per task: it should stay flat.
//
//	scripts/with-postgres.sh go test -run '^$' -bench AbortSubtree -benchtime 5x ./tasks/
func BenchmarkAbortSubtree(b *testing.B) {
	for _, size := range []struct {
		name   string
		fanout []int
	}{
		{"tasks=1093", []int{3, 3, 3, 3, 3, 3}},             // 1+3+…+729
		{"tasks=9841", []int{3, 3, 3, 3, 3, 3, 3, 1, 1, 1}}, // depth 10
	} {
		b.Run(size.name, func(b *testing.B) {
			pool, schema := testdb.Shared(b)
			var elapsed time.Duration
			var total int
			for b.Loop() {
				b.StopTimer()
				bb := newBenchBundle(b, pool, schema)
				root, n := bigTree(b, bb, size.fanout, 0)
				total = n
				b.StartTimer()
				start := time.Now()
				rep, err := bb.engine.Abort(bb.ctx, root.ID)
				elapsed += time.Since(start)
				require.NoError(b, err)
				require.Len(b, rep.Settled, n)
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*total), "ns/task")
		})
	}
}

// BenchmarkFanOutFanIn: one parent spawns 1,000 children and waits on them
// (all_settled); each child is started and completed in its own
// transactions; the last one wakes the parent. Reports the cost per child.
//
//	scripts/with-postgres.sh go test -run '^$' -bench FanOut -benchtime 3x ./tasks/
func BenchmarkFanOutFanIn(b *testing.B) {
	for _, children := range []int{100, 1000} {
		b.Run(fmt.Sprintf("children=%d", children), func(b *testing.B) {
			pool, schema := testdb.Shared(b)
			for b.Loop() {
				bb := newBenchBundle(b, pool, schema)
				parent, _, err := bb.engine.Create(bb.ctx, arbortype.CreateParams{ConversationID: bb.conv, Kind: "turn"})
				require.NoError(b, err)
				run, err := bb.engine.Start(bb.ctx, parent.ID)
				require.NoError(b, err)
				ids := make([]int64, children)
				for i := range ids {
					c, _, err := bb.engine.Create(bb.ctx, arbortype.CreateParams{ConversationID: bb.conv, OwnerID: parent.ID, Kind: "tool"})
					require.NoError(b, err)
					ids[i] = c.ID
				}
				res, err := bb.engine.WaitForChildren(bb.ctx, parent.ID, run.Token, core.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled})
				require.NoError(b, err)
				require.False(b, res.Woken)
				for _, id := range ids {
					c, err := bb.engine.Start(bb.ctx, id)
					require.NoError(b, err)
					_, err = bb.engine.Complete(bb.ctx, id, c.Token, nil)
					require.NoError(b, err)
				}
				p, err := bb.engine.Get(bb.ctx, parent.ID)
				require.NoError(b, err)
				require.Equal(b, arbortype.StatusPending, p.Status)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*children), "ns/child")
		})
	}
}

func newBenchBundle(b *testing.B, pool interface{}, schema string) *bundle {
	b.Helper()
	p, _ := testdb.Shared(b)
	return &bundle{ctx: b.Context(), pool: p, schema: schema, engine: enginetest.New(b, p, &tasks.Config{Schema: schema}), conv: testdb.Conversation(b)}
}
