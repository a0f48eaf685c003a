// Package migrations creates and upgrades arbor's tables in a schema the user
// chooses (default "arbor"), and River's tables beside them in the same schema
// so that a wake-up job can be inserted in the same transaction as the task
// change that needs it.
//
// The SQL lives in numbered files embedded from sql/. Each up file has a
// down twin. The guards generated from fsm's rules are kept once, the
// tasks' and conversations' in guard/ and the record guards in records/:
// the newest whole, each older version as a patch on its successor; a
// guard migration names the version it applies by a line of its own,
// `-- arbor:guard NNN` or `-- arbor:records NNN`, which is replaced by that
// version's text when the files are loaded (docs/design.md §2). A released migration's text never
// changes: the package's test pins the SHA-256 of each one as applied. arbor records what it applied in its own table,
// <schema>.arbor_migrations; River keeps its own (river_migration). All of
// one [Migrator.Up] or [Migrator.Down] runs in one transaction under an
// advisory lock, so two processes migrating at once apply each step once and
// a failed step leaves nothing behind.
//
// Code that uses the schema calls [Check] first and refuses to run against a
// version it does not know.
package migrations
