// Package faultharness is the fault harness that internal/chaos (runner
// processes killed, frozen and cut off, backends terminated, the server
// restarted: `make chaos`) and internal/failover (a pg_auto_failover
// cluster's primary failed over: `make failover`) share: the workload, the
// run log and the proof. Each suite keeps only its faults and scenarios.
//
// A suite's scenario starts with New, which gives the test a migrated
// schema of its own with the run log (one row per handler call, from its
// entry to its return), the side effects, the faults and an audit trigger
// on the tasks, and an engine on it; AddTurns creates conversations of the
// workload's tree (workload.go); each runner runs the Worker's Handlers,
// which log every call and side effect on a pool of their own (the outside
// world's record; UseOutside puts it on another database), and stops with
// Worker.Wait. The scenario records its faults (Fault), waits for the work
// (WaitProgress, WaitSettled) and ends with Verify: nothing lost, no task
// failed by a fault, no restart that no fault explains, no
// abandon_on_restart handler entered twice, no two calls of a task at
// once, no side effect after another call of its task started, no stale
// write, and the invariant checker clean; it logs the figures and returns
// them (Figures).
//
// The proof's own tests (proof_test.go) write violations by hand and make
// no fault, so they run under `make test`.
package faultharness
