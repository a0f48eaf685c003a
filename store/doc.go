// Package store names what arbor keeps in PostgreSQL that a user's own
// code meets beside arbor: the River job kinds arbor inserts into the
// schema's river_job table, for a service that runs its own River client
// on the same schema (its workers must not claim them, and its dashboards
// may filter them).
//
// arbor's SQL itself (every statement the library runs, and the row types)
// is internal: a user reads and writes tasks through package tasks, and
// runs them through package machine. The tables, their columns, the guard
// trigger and the roles a deployment grants are described in
// docs/design.md and docs/operations.md.
package store

// WakeJobKind is the River job kind of the jobs that wake sleeping and
// awaiting tasks at their time (args: task_id, conversation_id).
const WakeJobKind = "arbor_wake"

// PruneJobKind is the River job kind of the runners' periodic prune of
// settled history (tasks.Config.Retention, LogRetention).
const PruneJobKind = "arbor_prune"
