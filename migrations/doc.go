// Package migrations creates and upgrades arbor's tables in a schema the user
// chooses (default "arbor"), and River's tables beside them in the same schema
// so that a wake-up job can be inserted in the same transaction as the task
// change that needs it.
//
// Run [New] and [Migrator.Up] as the role that owns the schema, or `arbor
// migrate up`. Code that uses the schema calls [Check] first and refuses to
// run against a version it does not know.
//
// Each migration is plain SQL in a numbered pair of files embedded from
// sql/, an up and its down; version 1 is the v0.1.0 baseline, the whole
// schema. [SQL] returns a migration's SQL for a schema and `arbor migrate
// print` prints it, for a team that runs migrations with its own tool
// (docs/operations.md). The guards generated from fsm's rules are written
// whole into the newest migration that holds them by `go generate ./fsm`.
// arbor records what it applied in its own table,
// <schema>.arbor_migrations; River keeps its own (river_migration). All of
// one [Migrator.Up] or [Migrator.Down] runs in one transaction under an
// advisory lock, so two processes migrating at once apply each step once and
// a failed step leaves nothing behind.
package migrations
