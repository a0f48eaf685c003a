// Package chaos holds arbor's fault tests, run by `make chaos` against a real
// PostgreSQL: runner processes killed with SIGKILL (also at high frequency
// during large flushes, and beside a CPU hog), frozen with SIGSTOP past
// their conversation lease and for less than it, every arbor backend
// terminated with pg_terminate_backend (LISTEN connections included) for
// two minutes (under the default lease: see terminate_test.go; and again
// beside a CPU hog, with hundreds of abandon_on_restart tasks:
// terminateload_test.go), the database server restarted (fast and
// immediate), a conversation row locked by an outside connection, a node's
// route to the database blackholed, and the owner of 100,000 children
// aborted beside the workload and a CPU hog (bigabort_test.go), and runners
// killed while concurrency limits hold the work of three tenants back
// (tenants_test.go: no limit exceeded, sampled and proved from the run
// log, no slot leaked), and runners killed at their own creates, which
// start the turns they create (createstart_test.go: every create whose
// caller died issued again by its key, each turn there once, and some
// turns proved started by their creates). Each
// scenario runs internal/faultharness's workload of trees —
// parallel children under all_settled, a fail_fast group whose failing
// child aborts its siblings, a sleep, a retried failure, an
// abandon_on_restart child, and in one scenario big fan-outs — and ends
// with its proof: nothing lost; no two calls of a task at once,
// measured from the handler's entry to its return; no side effect after
// another call of its task started; no task failed by a fault; no restart
// that no kill, freeze, cut or lock explains, at the engine's default
// restart limit; no write from a run whose token was dead; no
// abandon_on_restart handler entered twice; and the invariant checker
// clean.
//
// The package is tests only, and keeps only its faults: child_test.go is
// the runner process (this test binary re-executed, running
// faultharness.Worker's handlers) and what the faults do to it, each other
// file a scenario; the workload, the run log and the proof are
// internal/faultharness's, which internal/failover shares. Its tests
// restart the database server and terminate backends, so they skip unless
// ARBOR_CHAOS=1, which only `make chaos` sets, on a throwaway server of its
// own: `make test` runs `go test ./...` on a server that every package's
// tests share. They must not import anything but arbor's public packages
// and its test helpers, as an application would.
package chaos
