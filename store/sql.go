package store

import "embed"

// SQL holds every statement arbor runs, as named queries in the files of
// its queries folder, one file per concept (claim.sql, lease.sql,
// retention.sql…). Each statement follows a line "-- name: Name" and ends
// with a semicolon; the comment above the name says what it does and which
// locks it takes. arbor renders them once for the configured schema,
// replacing {schema} (the quoted schema name), {task_columns},
// {run_columns} and {summary_columns} (the columns of a task row, of a
// run's state and of a listing's row), {live} and {settled} (the live
// and the settled statuses) and {log_status} (the one INSERT of the
// conversation log's status entries that every status write carries, see
// queries/task_write.sql), and sends nothing else: no SQL is built from
// input.
//
// It is exported to be read (fs.ReadFile(store.SQL, "queries/lease.sql")),
// as a DBA reads the migrations; arbor reads it once at start-up, so a
// change to the variable has no effect.
//
//go:embed queries/*.sql
var SQL embed.FS
