// Package failover holds arbor's high-availability tests, run by `make
// failover` against a real cluster: pg_auto_failover with a monitor, a
// primary and a synchronous standby, each a local PostgreSQL 15
// (scripts/with-failover-cluster.sh). The runners and the tests connect
// with a multi-host connection string (both data nodes,
// target_session_attrs=read-write), as an application does. Each scenario
// runs internal/faultharness's workload of trees — parallel children, a
// fail_fast group, sleeps, a retried failure, an abandon_on_restart child
// — with an agent that reserves and records a budget and awaits an event,
// and a waiter whose await times out, over 100 conversations under two
// runners, and fails the primary over while it runs: the primary
// SIGKILLed, a planned switchover, the primary's network cut until the
// monitor promotes the standby, and a failover during a completer flush
// and during a prune. Each ends with internal/faultharness's proof (run
// log of handler calls from entry to return, side-effect log, audit of
// every row version) held to what a failover must give: nothing lost, no two calls
// of a task at once, no stale write, no task failed, no restart counted
// (every task's attempt stays 0), no follower left hanging, every sleep
// woken, every approval an Emit acknowledged in the database, and the
// invariant checker clean. A scenario starts only once the primary's
// commits wait for a synchronous standby (cluster.healthy): what a
// failover may lose under asynchronous replication is the cluster's
// loss, not arbor's, and the acknowledged emits tell the two apart. The figures the tests log —
// the time from the fault to the first task completed on the new primary
// and to every conversation settled, a client's longest call, the
// followers' lag — are docs/operations.md's "High availability".
//
// The package is tests only, and they skip unless the cluster script runs
// them (ARBOR_FAILOVER_CTL): they kill and cut off database servers. It
// keeps only its faults (cluster_test.go, failover_test.go) and scenarios;
// the workload, the run log and the proof are internal/faultharness's,
// which internal/chaos shares: here the runners run in the test's process,
// each on pools of its own, since no runner dies, and the run log goes to
// the monitor's server, which no fault touches.
package failover
