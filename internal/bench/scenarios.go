package bench

import (
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Labels of the subjects, shared by the scenarios.
var (
	labelArborEngine       = "arbor engine, driven by the harness's own claim loop (not machine.Runner): Engine.Claim in batches, one transaction per operation"
	labelArborRunner       = "arbor machine.Runner, RunnerConfig{} (every default): the N tasks created with Engine.CreateMany in batches (as River's InsertMany), one conversation per task"
	labelArborRunnerCreate = "arbor machine.Runner, RunnerConfig{}: one Engine.Create per task (a transaction each, as a chat backend creates a turn per message), one conversation per task"
	labelArborRunnerTree   = "arbor machine.Runner, RunnerConfig{}: parents spawn their children with Run.SpawnMany and wait (all_settled)"
	labelCeilingRow        = "the per-row ceiling: plain SQL on the minimal table, every row inserted by a single-row transaction of its own, then claimed and completed in batches"
	labelCeiling           = "the Postgres ceiling: plain SQL, batched statements, minimal table"
	labelRiver             = "River " + riverVersion + ", InsertMany + client with River's benchmark settings"
	labelDBOS              = "DBOS Transact Go, parent workflows starting child workflows (internal/bench/dbos subprocess)"
	labelGoWorkflowsAct    = "go-workflows, Postgres backend woken in process (monoprocess, as its own benchmark runs it): turn workflows running their tool calls as activities (internal/bench/goworkflows subprocess)"
	labelGoWorkflowsSub    = "go-workflows, the same, the tool calls as sub-workflows"
)

// Scenarios returns every scenario of issue 6, in the order they run. A
// scenario that waits for code not on the branch says so in Pending (none
// does now); making one run is writing its RunFunc, setting it as the
// subject's Run and clearing Pending.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Key:   "a",
			Title: "flat: N root tasks, no-op handler — created, claimed, run, completed",
			About: "runner: a started machine.Runner with RunnerConfig{} while N root tasks (one conversation per task, a turn each) are created " +
				"with Engine.CreateMany in batches of River's size (N over the connections, at most 5,000); it opens the conversations (lease, " +
				"reconcile_on_open and claim, set-based, in one transaction for many), runs the no-op handler, and completes through its batching " +
				"completer. runner-create: the same with one Engine.Create per task. arbor (reference line, not the Runner): the harness's own " +
				"claim loop over the engine, one transaction per Complete. ceiling: plain SQL on a minimal table — batched INSERT, claim with " +
				"UPDATE … SKIP LOCKED, complete with one UPDATE … WHERE id = ANY(…) per batch; ceiling-row: the same with a transaction per " +
				"inserted row. River: InsertMany, then a client with River's benchmark settings (MaxWorkers 2000, FetchCooldown 2 ms, " +
				"FetchPollInterval 20 ms) works no-op jobs. Same number of connections for all (the runner adds its LISTEN and wake-service " +
				"connections); time from the first insert to the last completion.",
			Metric:     Throughput,
			Goal:       "runner ≥ River's jobs/s and ≥ 30% of the ceiling; runner-create ≥ 50% of ceiling-row",
			Sizes:      []string{"5000", "8000"},
			QuickSizes: []string{"100", "400"},
			SizeForm:   "N, the number of tasks",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "runner", Arbor: true, Label: labelArborRunner, Run: flatRunnerBatched, Versus: []string{"ceiling", "river"}},
				{Key: "runner-create", Arbor: true, Label: labelArborRunnerCreate, Run: flatRunnerCreates, Versus: []string{"ceiling-row"}},
				{Key: "arbor", Arbor: true, Label: labelArborEngine, Run: flatArborEngine, MaxRounds: 1, Versus: []string{"ceiling"}},
				{Key: "ceiling", Label: labelCeiling, Run: flatCeiling},
				{Key: "ceiling-row", Label: labelCeilingRow, Run: flatCeilingRow},
				{Key: "river", Label: labelRiver, Run: flatRiver},
			},
		},
		{
			Key:   "b",
			Title: "fan-out/fan-in: P parents × C children, all_settled",
			About: "runner: a started machine.Runner with RunnerConfig{}; P parents, each the turn of a conversation of its own, created with " +
				"one Engine.Create each; a parent's handler spawns its C children at once (Run.SpawnMany) and waits on them (all_settled); " +
				"children complete; the last child's settle wakes the parent, which the same flush claims again; it completes. arbor (reference " +
				"line, not the Runner): the harness's claim loop over the engine, a transaction per spawn-and-wait and per Complete. DBOS: P " +
				"parent workflows, each starting C child workflows and waiting for their results, in a subprocess with the same number of " +
				"connections. Tasks = P × (C + 1); time from the first parent created to the last completed.",
			Metric:     Throughput,
			Goal:       "runner ≥ 5× DBOS's tasks/s on the same tree",
			Sizes:      []string{"20x100", "40x200"},
			QuickSizes: []string{"2x5", "8x10"},
			SizeForm:   "PxC, parents x children per parent",
			ParseSize:  parsePC,
			Subjects: []Subject{
				{Key: "runner", Arbor: true, Label: labelArborRunnerTree, Run: fanoutRunner},
				{Key: "arbor", Arbor: true, Label: labelArborEngine, Run: fanoutArborEngine, MaxRounds: 1, Versus: []string{}},
				{Key: "dbos", Label: labelDBOS, Run: fanoutDBOS, Subprocess: "dbos"},
			},
		},
		{
			Key:   "g",
			Title: "one Runner holding N conversations: 100 of them take turns, the rest are held idle",
			About: "A machine.Runner with RunnerConfig{} first runs a turn in each of N conversations (not timed), so that it holds all N; " +
				"then min(N, 100) of them take 10 turns each in a closed loop (Create a turn, wait until it completed, Create the next) " +
				"while the others stay held and idle. A turn spawns two tool calls at once, waits on them (all_settled) and completes: " +
				"three tasks. The figure is the timed phase's tasks/s: the same work at every N, so it says what holding idle " +
				"conversations costs. The note gives the turn latency p50/p99, the runner's lease warnings, and the heap per held " +
				"conversation, of the median round; the figure is the median over the rounds, like the other throughput scenarios'.",
			Metric:     Throughput,
			Goal:       "at 10,000 held conversations ≥ 80% of the throughput at 100, no lease warnings",
			Sizes:      []string{"100", "10000"},
			QuickSizes: []string{"10", "40"},
			SizeForm:   "N, the number of held conversations",
			ParseSize:  parseHeld,
			Subjects:   []Subject{{Key: "runner", Arbor: true, Label: "arbor machine.Runner, RunnerConfig{}", Run: heldRunner}},
		},
		{
			Key:   "i",
			Title: "what an agent backend waits on: AwaitSettled, emit → handler re-entered, stream delivery (p50/p99/max)",
			About: "A machine.Runner with RunnerConfig{}; N operations over 10 conversations, one at a time per conversation. " +
				"await-settled: a turn completes in its handler; a caller outside the runner waits with Engine.AwaitSettled; latency = " +
				"AwaitSettled's return − the handler's Complete return (both after the commit). emit: a turn awaits an event; the caller " +
				"emits it; latency = the handler's re-entry − Emit's return. stream: a handler publishes a progress entry; a follower of " +
				"the conversation (Engine.Follow) receives it; latency = receipt − Progress's return. Run once per size.",
			Metric:     Latency,
			Goal:       "each p99 ≤ 20 ms",
			Sizes:      []string{"50", "200", "500"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of operations",
			ParseSize:  parseN,
			MaxRounds:  1,
			Subjects: []Subject{
				{Key: "await-settled", Arbor: true, Label: "Engine.AwaitSettled after the turn's commit", Run: awaitSettledLatency},
				{Key: "emit", Arbor: true, Label: "Engine.Emit → the awaiting handler re-entered", Run: emitLatency},
				{Key: "stream", Arbor: true, Label: "Run.Progress → a follower (Engine.Follow) receives it", Run: streamLatency},
			},
		},
		{
			Key:   "j",
			Title: "budget reservation cost: Run.Reserve + Run.Record and Run.Spend against Run.Checkpoint, per operation",
			About: "One handler, run by a machine.Runner with RunnerConfig{}, makes N calls one after the other; only those are timed and " +
				"counted. Its task is a tool call under a sub-agent under a turn, with three budgets above it: the sub-agent's " +
				"(SpawnParams.Budgets), the turn's (CreateParams.Budgets) and the conversation's (CreateParams.ConversationBudgets), one " +
				"counter, never exhausted. reserve: Run.Reserve then Run.Record (two commits), one operation; spend: Run.Spend (one); " +
				"checkpoint, the baseline: Run.Checkpoint with a small state (one). Afterwards every budget must show the N operations " +
				"spent and nothing held. The ratios divide ops/s: reserve÷checkpoint 0.5x means a reservation costs two checkpoints.",
			Metric:     Throughput,
			Unit:       "op",
			Sizes:      []string{"100", "1000"},
			QuickSizes: []string{"10", "40"},
			SizeForm:   "N, the number of operations",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "reserve", Arbor: true, Versus: []string{"checkpoint"}, Label: "Run.Reserve + Run.Record under three budgets", Run: budgetReserve},
				{Key: "spend", Arbor: true, Versus: []string{"checkpoint"}, Label: "Run.Spend under three budgets", Run: budgetSpend},
				{Key: "checkpoint", Label: "Run.Checkpoint, a small state (the baseline: a handler's plainest write)", Run: budgetCheckpoint},
			},
		},
		{
			Key:   "h",
			Title: "agent turns: P turns × C parallel tool calls, all_settled",
			About: "The shape of an agent backend: P turns, each a conversation of its own (a message each, one Engine.Create), whose " +
				"handler makes C parallel tool calls (Run.SpawnMany), waits on them (all_settled) and, run again, completes the turn. " +
				"runner: machine.Runner with RunnerConfig{}; DBOS: P parent workflows starting C child workflows each, in the internal/bench/dbos " +
				"subprocess. goworkflows: go-workflows' Postgres backend in a schema of its own, wrapped in its monoprocess backend (the worker " +
				"woken in process, not polling, as go-workflows' own benchmark runs it), worker.DefaultOptions, in the internal/bench/goworkflows " +
				"subprocess: P turn workflows, each running C activities at once and waiting for all of them; goworkflows-sub: the same with " +
				"the C tool calls as sub-workflows. Every subject on the same number of connections. Tasks = P × (C + 1).",
			Metric:     Throughput,
			Goal:       "runner ≥ 5× DBOS's tasks/s (below 3× is not done), ≥ 6× go-workflows' (issue 42)",
			Sizes:      []string{"300x5", "1000x5"},
			QuickSizes: []string{"5x5", "20x5"},
			SizeForm:   "PxC, turns x tool calls per turn",
			ParseSize:  parsePC,
			Subjects: []Subject{
				{Key: "runner", Arbor: true, Label: labelArborRunnerTree, Run: fanoutRunner},
				{Key: "dbos", Label: labelDBOS, Run: fanoutDBOS, Subprocess: "dbos"},
				{Key: "goworkflows", Label: labelGoWorkflowsAct, Run: agentGoWorkflows("activities"), Subprocess: "goworkflows"},
				{Key: "goworkflows-sub", Label: labelGoWorkflowsSub, Run: agentGoWorkflows("subworkflows"), Subprocess: "goworkflows"},
			},
		},
		{
			Key:   "c",
			Title: "abort of a subtree of N tasks",
			About: "arbor: Engine.Abort of the root of a tree of N tasks (built with bulk SQL through the guard " +
				"trigger: fan-out 3, every third task running), one transaction, leaves first. ceiling: one " +
				"recursive UPDATE that marks the same tree aborted in a minimal table. Time of the abort only.",
			Metric:     Throughput,
			Goal:       "flat cost per task from the smallest to the largest size (100,000 tasks: what an abort of a huge subtree holds the conversation for)",
			Sizes:      []string{"1000", "100000"},
			QuickSizes: []string{"50", "200"},
			SizeForm:   "N, the number of tasks in the tree",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "arbor", Arbor: true, Label: "arbor Engine.Abort", Run: abortArbor},
				{Key: "ceiling", Label: labelCeiling, Run: abortCeiling},
			},
		},
		{
			Key:   "d",
			Title: "reconcile_on_open of a conversation with N running tasks",
			About: "A tree of N tasks in one conversation (bulk SQL, fan-out 3), every task running with a token, " +
				"the conversation without a holder, as a dead node leaves it. arbor: the transaction machine.Runner " +
				"opens a conversation with — store.TakeConversation + recovery.OnOpen, one commit; every task must " +
				"come back pending with attempt 1. ceiling: one plain UPDATE … SET status = 'pending', attempt = attempt + 1 " +
				"… WHERE conversation_id = $1 AND status = 'running' on the same rows of arbor's table. Time of that " +
				"transaction only.",
			Metric:     Throughput,
			Goal:       "flat cost per task from the smallest to the largest size",
			Sizes:      []string{"100", "5000"},
			QuickSizes: []string{"50", "200"},
			SizeForm:   "N, the number of running tasks",
			ParseSize:  parseN,
			Subjects: []Subject{
				{Key: "arbor", Arbor: true, Label: "arbor: TakeConversation + recovery.OnOpen, one transaction", Run: reconcileArbor},
				{Key: "ceiling", Label: "one plain UPDATE of the same rows (no lease, no per-task checks)", Run: reconcileCeiling},
			},
		},
		{
			Key:   "e",
			Title: "wake lateness p50/p99/max",
			About: "N root tasks (over 50 conversations) created, started and put to sleep with Engine.SleepUntil on " +
				"env.Conns goroutines, each due 0.1–3 s after its sleep; a machine.Waker (production settings) wakes them. " +
				"Lateness per task = the waker's OnWake (called after the wake's commit) minus the wake time. " +
				"timers: the Waker's local timers and River's wake jobs; river-only: the same Waker with DisableTimers. " +
				"Run once per size (its percentiles are over N wakes already).",
			Metric:     Latency,
			Sizes:      []string{"100", "400", "1600"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of sleeping tasks",
			ParseSize:  parseN,
			MaxRounds:  1,
			Subjects: []Subject{
				{Key: "timers", Arbor: true, Label: "arbor machine.Waker, timers on (production default)", Run: wakeTimers},
				{Key: "river-only", Arbor: true, Label: "arbor machine.Waker, DisableTimers: River's wake jobs alone", Run: wakeRiverOnly},
			},
		},
		{
			Key:   "k",
			Title: "a Runner's reflexes: sleep re-entry lateness, fail_fast sibling cancel latency p50/p99/max",
			About: "N conversations through one machine.Runner with RunnerConfig{}. sleep: a turn sleeps 1.5 s (SleepUntil) and " +
				"notes when its handler is entered again; latency = that entry minus the wake time asked for (timer, wake " +
				"transaction, claim, start). sibling-cancel: a group spawns a sibling that waits for its context and a doomed " +
				"child that fails non-retryable once the sibling runs, under fail_fast; latency = the sibling's context cancelled " +
				"minus the doomed handler's return (the failure's flush, its abort, the cancel on this node). Run once per size.",
			Metric:     Latency,
			Sizes:      []string{"50", "200", "500"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of conversations",
			ParseSize:  parseN,
			MaxRounds:  1,
			Goal:       "sleep p99 ≤ 50 ms; sibling cancel p50 ≤ 5 ms",
			Subjects: []Subject{
				{Key: "sleep", Arbor: true, Label: "arbor machine.Runner, SleepUntil → handler re-entered", Run: sleepReentry},
				{Key: "sibling-cancel", Arbor: true, Label: "arbor machine.Runner, fail_fast failure → sibling's context cancelled", Run: siblingCancel},
			},
		},
		{
			Key:   "l",
			Title: "cost per task as the tables grow: (a)'s runner after N settled tasks kept, against a fresh schema",
			About: "fresh: (a)'s runner subject (a machine.Runner with RunnerConfig{}, the tasks created with Engine.CreateMany in " +
				"batches, one conversation per task) at 8,000 tasks on a fresh schema. aged: the same 8,000 in a schema where N " +
				"one-task conversations were first created, run and settled by a runner of their own (not timed), kept with retention " +
				"off (the default), then vacuumed and analyzed as autovacuum would have by then: the tables, their indexes and the " +
				"conversation log hold all N. Same round, same server; the ratio is aged ÷ fresh.",
			Metric:     Throughput,
			Goal:       "aged ≥ 80% of fresh at 1,000,000 settled tasks",
			Sizes:      []string{"1000000"},
			QuickSizes: []string{"2000"},
			SizeForm:   "N, the settled tasks kept before the timed run of 8,000",
			ParseSize:  parseAged,
			Subjects: []Subject{
				{Key: "aged", Arbor: true, Label: "arbor machine.Runner, RunnerConfig{}, after N settled tasks", Run: flatAged, MaxRounds: 1, Timeout: 30 * time.Minute, Versus: []string{"fresh"}},
				{Key: "fresh", Label: "the same on a fresh schema", Run: flatFresh},
			},
		},
		{
			Key:   "f",
			Title: "child settles → parent's handler runs again: latency p50/p99/max",
			About: "N parents, one conversation each, through one machine.Runner with RunnerConfig{} (1,000 workers: one is free whenever a parent wakes, so no time goes to queueing for a worker): " +
				"a parent's handler spawns one child and waits on it (all_settled); the child's handler completes. " +
				"Latency per parent = the parent handler's re-entry minus the moment the child's handler called Complete " +
				"(the parent can be re-entered before that Complete returns), both noted in memory by the handlers. The N parents run twice on the same runner, a cold round and the timed one: " +
				"the timed round measures the steady state, not the first statements of fresh backends (the Note gives the cold round's figures). Run once per size.",
			Metric:     Latency,
			Sizes:      []string{"50", "200", "500"},
			QuickSizes: []string{"10", "20", "40"},
			SizeForm:   "N, the number of parents",
			ParseSize:  parseN,
			MaxRounds:  1,
			Goal:       "p99 ≤ 20 ms",
			Subjects:   []Subject{{Key: "runner", Arbor: true, Label: "arbor machine.Runner, spawn → wait → child completes → parent re-entered", Run: resumeRunner}},
		},
		{
			Key:   "m",
			Title: "fairness: tenant B's start latency beside tenant A's flood of N turns (p50/p99/max)",
			About: "One machine.Runner with RunnerConfig{}. flood: tenant A creates N one-task turns (one conversation each, Engine.CreateMany " +
				"in batches, a no-op handler) while tenant B creates one turn every 100 ms (Engine.Create, a conversation each, through an engine of its own with no runner, " +
				"as a web tier in another process does: the runner's open and claim start B's turns, not their creates) until A's " +
				"last completes; latency = B's handler entered − its Create's return. alone: B's turns the same way with no flood (30, " +
				"or N if fewer). The ratio is flood's p99 ÷ alone's, per round (design.md §3.15: B's next turn waits for one run to " +
				"end, not behind the flood). The note gives the flood's own tasks/s in that run.",
			Metric:     Latency,
			Goal:       "flood's p99 within 2× alone's",
			Sizes:      []string{"3000", "10000"},
			QuickSizes: []string{"300", "1000"},
			SizeForm:   "N, tenant A's turns",
			ParseSize:  parseN,
			MaxRounds:  3,
			Subjects: []Subject{
				{Key: "flood", Arbor: true, Versus: []string{"alone"}, Label: "tenant B's turns beside tenant A's flood of N", Run: fairLatencyFlood},
				{Key: "alone", Label: "tenant B's turns alone", Run: fairLatencyAlone},
			},
		},
		{
			Key:   "n",
			Title: "fairness: tenant A's flood of N turns beside tenant B's turn every 100 ms, against the flood alone",
			About: "The runs of (m), timed for A: with-b is (m)'s flood (B's turns beside it), alone the same flood with no B. The figure " +
				"is A's tasks/s, from its first create to its last completion; the note gives B's start latency in that run.",
			Metric:     Throughput,
			Goal:       "with-b ≥ 0.9× alone",
			Sizes:      []string{"3000", "10000"},
			QuickSizes: []string{"300", "1000"},
			SizeForm:   "N, tenant A's turns",
			ParseSize:  parseN,
			MaxRounds:  3,
			Subjects: []Subject{
				{Key: "with-b", Arbor: true, Versus: []string{"alone"}, Label: "tenant A's flood beside tenant B's turns", Run: fairThroughputWithB},
				{Key: "alone", Label: "tenant A's flood alone", Run: fairThroughputAlone},
			},
		},
		{
			Key:   "o",
			Title: "priorities: an interactive turn's start latency behind a background backlog of N (p50/p99/max)",
			About: "One tenant, one machine.Runner with RunnerConfig{}. backlog: N background turns of priority 0 (one conversation " +
				"each, Engine.CreateMany, a no-op handler) are created before the runner starts; from its start, an interactive turn " +
				"of priority 60 (CreateParams.Priority) is created every 100 ms (through an engine of its own with no runner, as in (m)) until the backlog drained; latency = its handler entered " +
				"− its Create's return. empty: the same turns with no backlog (30, or N if fewer). The ratio is backlog's p99 ÷ empty's, " +
				"per round.",
			Metric:     Latency,
			Sizes:      []string{"3000", "10000"},
			QuickSizes: []string{"300", "1000"},
			SizeForm:   "N, the background turns",
			ParseSize:  parseN,
			MaxRounds:  3,
			Subjects: []Subject{
				{Key: "backlog", Arbor: true, Versus: []string{"empty"}, Label: "interactive turns (priority 60) behind N background ones (priority 0)", Run: priorityBacklog},
				{Key: "empty", Label: "interactive turns with no backlog", Run: priorityEmpty},
			},
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

// parseHeld is parseN for scenario (g): the tasks are those of the timed
// phase (three per turn).
func parseHeld(spec string) (Size, error) {
	s, err := parseN(spec)
	s.Tasks = 3 * min(s.N, heldActive) * heldTurns
	return s, err
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
