package bench

import (
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
)

// Labels of the subjects, shared by the scenarios.
var (
	labelArborEngine = "arbor, engine loop (runner pending issue 5): one transaction per operation"
	labelArborBatch  = "arbor, engine loop, what-if: the same operations as …Tx forms, one transaction (one commit) per claim batch"
	labelSetSQL      = "what-if, NOT arbor: the set-based create/complete SQL NOTES-issue6.md proposes, on arbor's schema (guard trigger, indexes), root tasks only"
	labelCeiling     = "the Postgres ceiling: plain SQL, batched statements, minimal table"
	labelRiver       = "River " + riverVersion + ", InsertMany + client with River's benchmark settings"
	labelDBOS        = "DBOS Transact Go, parent workflows starting child workflows (bench/dbos subprocess)"
)

// Scenarios returns every scenario of issue 6, in the order they run. The
// ones that wait for code not on this branch say so in Pending; making one
// run is writing its RunFunc, setting it as the subject's Run and clearing
// Pending.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Key:   "a",
			Title: "flat: N root tasks, no-op handler — created, claimed, run, completed",
			About: "arbor: engine loop (runner pending issue 5) — N Creates (one conversation per root task, " +
				"a turn each), then workers Claim batches and Complete each task, one transaction per Complete. " +
				"ceiling: plain SQL on a minimal table — batched INSERT, claim with UPDATE … SKIP LOCKED, " +
				"complete with one UPDATE … WHERE id = ANY(…) per batch. River: InsertMany, then a client " +
				"with River's benchmark settings (MaxWorkers 2000, FetchCooldown 2 ms, FetchPollInterval 20 ms) " +
				"works no-op jobs. Same number of connections for all; time from the first insert to the last completion.",
			Metric:     Throughput,
			Goal:       "arbor ≥ River's jobs/s and ≥ 30% of the ceiling",
			Sizes:      []string{"2000", "8000", "24000"},
			QuickSizes: []string{"100", "200", "400"},
			SizeForm:   "N, the number of tasks",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "arbor", Arbor: true, Label: labelArborEngine, Run: flatArborEngine},
				{Key: "arbor-batch", Arbor: true, Label: labelArborBatch + " (creates too)", Run: flatArborBatched},
				{Key: "set-sql", Arbor: true, Label: labelSetSQL, Run: flatSetBased},
				{Key: "ceiling", Label: labelCeiling, Run: flatCeiling},
				{Key: "river", Label: labelRiver, Run: flatRiver},
			},
		},
		{
			Key:   "b",
			Title: "fan-out/fan-in: P parents × C children, all_settled",
			About: "arbor: engine loop (runner pending issue 5) — each parent, when claimed, creates its C children " +
				"and waits on them (all_settled) in one transaction; children are claimed and completed; the last " +
				"child wakes its parent, which is claimed again and completes. DBOS: P parent workflows, each " +
				"starting C child workflows and waiting for their results, in a subprocess with the same " +
				"number of connections. Tasks = P × (C + 1); time from the first parent created to the last completed.",
			Metric:     Throughput,
			Goal:       "arbor ahead of DBOS on the same tree",
			Sizes:      []string{"10x20", "20x100", "40x200"},
			QuickSizes: []string{"2x5", "4x10", "8x10"},
			SizeForm:   "PxC, parents x children per parent",
			ParseSize:  parsePC,
			Subjects: []Subject{
				{Key: "arbor", Arbor: true, Label: labelArborEngine, Run: fanoutArborEngine},
				{Key: "arbor-batch", Arbor: true, Label: labelArborBatch + " (completes; each spawn is already one)", Run: fanoutArborBatched},
				{Key: "dbos", Label: labelDBOS, Run: fanoutDBOS},
			},
		},
		{
			Key:   "c",
			Title: "abort of a subtree of N tasks",
			About: "arbor: Engine.Abort of the root of a tree of N tasks (built with bulk SQL through the guard " +
				"trigger: fan-out 3, every third task running), one transaction, leaves first. ceiling: one " +
				"recursive UPDATE that marks the same tree aborted in a minimal table. Time of the abort only.",
			Metric:     Throughput,
			Goal:       "flat cost per task from the smallest to the largest size",
			Sizes:      []string{"1000", "5000", "25000"},
			QuickSizes: []string{"50", "100", "200"},
			SizeForm:   "N, the number of tasks in the tree",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "arbor", Arbor: true, Label: "arbor Engine.Abort", Run: abortArbor},
				{Key: "ceiling", Label: labelCeiling, Run: abortCeiling},
			},
		},
		{
			// To implement: a RunFunc that puts N tasks of one conversation
			// in running (bulk SQL, as treeSQL does), then times the
			// machine's open of that conversation (reconcile_on_open).
			Key:        "d",
			Title:      "reconcile_on_open of a conversation with N running tasks",
			Metric:     Throughput,
			Goal:       "flat cost per task from the smallest to the largest size",
			Sizes:      []string{"1000", "4000", "16000"},
			QuickSizes: []string{"50", "100", "200"},
			SizeForm:   "N, the number of running tasks",
			ParseSize:  parseN,
			Subjects:   []Subject{{Key: "arbor", Arbor: true, Label: "arbor reconcile_on_open"}},
			Pending:    "not yet implemented (issue 5): reconcile_on_open and the machines are not on this branch",
		},
		{
			// To implement: a RunFunc that puts N tasks to sleep until
			// staggered times through the runner (with its local timers and
			// River's wake jobs) and records, per task, how late its handler
			// ran after its wake time (Measurement.Latencies).
			Key:        "e",
			Title:      "wake lateness p50/p99",
			Metric:     Latency,
			Sizes:      []string{"100", "400", "1600"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of sleeping tasks",
			ParseSize:  parseN,
			Subjects:   []Subject{{Key: "arbor", Arbor: true, Label: "arbor wake"}},
			Pending:    "pending merge of the sleep work (machine.Waker, River wake jobs): not on this branch",
		},
		{
			// To implement: a RunFunc that runs P parents waiting on children
			// under the runner and records, per parent, the time from its
			// last child's settle commit to its handler running again
			// (Measurement.Latencies).
			Key:        "f",
			Title:      "child settles → parent's handler runs again: latency p50/p99",
			Metric:     Latency,
			Sizes:      []string{"100", "400", "1600"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of parents",
			ParseSize:  parseN,
			Subjects:   []Subject{{Key: "arbor", Arbor: true, Label: "arbor resume"}},
			Pending:    "not yet implemented (issue 5): needs the node runner, which is not on this branch",
		},
	}
}

// riverVersion is the version of River this binary was built with.
var riverVersion = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "(version unknown)"
}()

func parseN(spec string) (Size, error) {
	n, err := strconv.Atoi(spec)
	if err != nil || n < 1 || n > 1_000_000 {
		return Size{}, fmt.Errorf("want a whole number from 1 to 1000000")
	}
	return Size{Spec: spec, Tasks: n, N: n}, nil
}

func parsePC(spec string) (Size, error) {
	ps, cs, ok := strings.Cut(strings.ToLower(spec), "x")
	p, err1 := strconv.Atoi(ps)
	c, err2 := strconv.Atoi(cs)
	if !ok || err1 != nil || err2 != nil || p < 1 || c < 1 || p > 10_000 || c > 10_000 {
		return Size{}, fmt.Errorf("want PxC, each from 1 to 10000")
	}
	return Size{Spec: spec, Tasks: p * (c + 1), P: p, C: c}, nil
}
