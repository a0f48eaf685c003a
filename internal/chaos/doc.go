// Package chaos holds arbor's fault tests, run by `make chaos` against a real
// PostgreSQL: runner processes killed with SIGKILL and frozen with SIGSTOP
// past their conversation lease, every arbor backend terminated with
// pg_terminate_backend (LISTEN connections included), and the database
// server restarted (fast and immediate). Each scenario runs the same
// workload of trees — parallel children under all_settled, a fail_fast group
// whose failing child aborts its siblings, a sleep, a retried failure, an
// abandon_on_restart child — and ends with the same proof: nothing lost, no
// two live runs of a task at once, no write from a run whose token was dead,
// no task failed by a fault, no abandon_on_restart task run twice, and the
// invariant checker clean.
//
// The package is tests only (workload_test.go is the workload and its run
// log, harness_test.go the schema additions that make the proof — the run
// log and the audit trigger — and verify_test.go the proof itself). Its
// tests restart the database server and terminate backends, so they skip
// unless ARBOR_CHAOS=1, which only `make chaos` sets, on a throwaway server
// of its own: `make test` runs `go test ./...` on a server that every
// package's tests share. They must not import anything but arbor's public
// packages and its test helpers, as an application would.
package chaos
