// Package bench is arbor's side-by-side benchmark harness (issue 6): it runs
// each scenario at its sizes (two per throughput scenario by default)
// against arbor and against baselines measured in the same run on the same
// PostgreSQL — the plain-SQL ceiling, River, DBOS Transact Go and
// go-workflows (each a separate module, internal/bench/dbos and
// internal/bench/goworkflows, run as a subprocess) — and reports arbor's
// figure, each baseline's, their ratio and the cost per task at each size,
// as a table and as JSON.
//
// A performance claim about arbor counts only as such a ratio: the
// development machines are too noisy for absolute figures to mean much
// from one run to the next. So the subjects of a scenario run interleaved
// in rounds (every subject once per round, in an order that changes from
// round to round), each ratio is computed per round from the two runs of
// that round, and the table shows the median of the per-round ratios with
// their range (rounds.go).
//
// Every run of a subject (one implementation at one size) gets a fresh,
// migrated schema that is dropped afterwards, so no run sees another's rows
// or bloat. Figures are measured, never computed from assumptions: a
// subject that cannot run (DBOS or go-workflows not buildable, a feature
// not merged yet) says so in the table instead of showing a number.
//
// Adding a scenario is writing one [RunFunc] per subject and listing it in
// [Scenarios]; the scenarios that wait for the runner (issue 5) and the sleep
// work are already listed with the reason they cannot run yet.
//
// Soak is the other half (issue 14): a Runner for minutes under a steady
// load while prune deletes what ages out, the tables and the latency
// sampled every interval, and a verdict on whether they stayed flat.
//
// The harness is test and tooling code: it may run SQL of its own (the
// ceiling baseline, the bulk tree builder, the counters), which arbor's
// library packages must not.
package bench
