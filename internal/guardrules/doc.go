// Package guardrules holds the rules the database holds every row of
// arbor's tables to, beside the transition table of package fsm: which
// columns of a task change with which status change (ColumnRules, RowRules),
// what a new task and a fork's copy look like (InsertRules, InsertChecks,
// ForkRules), when a row may be deleted (DeleteRules), what may become of
// the other records (RecordRules), and the SQLSTATE codes of a refusal.
//
// internal/fsmgen generates the guard triggers of the schema baseline and
// docs/state-machine.md from them (`go generate ./fsm`); the engine maps
// the codes to its errors. The package is pure: no I/O, no database.
package guardrules
