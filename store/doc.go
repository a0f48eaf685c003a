// Package store is arbor's SQL, to read: every statement the library runs,
// as a named query in the .sql files of store/queries (SQL), and what a
// user's own code meets of the schema beside arbor, the River job kinds arbor
// inserts into the schema's river_job table (WakeJobKind, PruneJobKind), for
// a service that runs its own River client on the same schema (its workers
// must not claim them, and its dashboards may filter them).
//
// The statements are grouped by concept (claim.sql starts tasks, lease.sql
// takes and fences conversations, retention.sql prunes…); above each, a
// comment says what it does and which locks it takes. A user does not run
// them: package tasks reads and writes tasks, package machine runs them,
// and the tables, the guard trigger and the roles a deployment grants are
// described in docs/design.md and docs/operations.md; the migrations that
// create the schema are package migrations.
package store

// WakeJobKind is the River job kind of the jobs that wake sleeping and
// awaiting tasks at their time (args: task_id, conversation_id).
const WakeJobKind = "arbor_wake"

// PruneJobKind is the River job kind of the runners' periodic prune of
// settled history (tasks.Config.Retention, LogRetention).
const PruneJobKind = "arbor_prune"
