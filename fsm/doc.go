// Package fsm holds arbor's task state machine: the statuses a task can be
// in, the events that move it, and the one transition table (docs/design.md §2) that
// every status write in arbor is validated against; and the rules the
// database holds every row of arbor's tables to: which columns of a task
// change with which status change ([ColumnRules], [RowRules],
// [InsertChecks], [ForkRules], [DeleteRules]) and what may become of the
// other records ([RecordRules]).
//
// The table is defined once, here, with github.com/looplab/fsm. Everything
// else is derived from it: the engine asks [Transition] before it writes a
// status, the database triggers that refuse impossible histories and
// forged records are generated from these rules, and so is
// docs/state-machine.md (internal/fsmgen; `go generate ./fsm`). Tests keep
// the generated files in sync. A refusal by those triggers carries one of
// the SQLState codes.
//
// The package is pure: no I/O, no database, no clock.
package fsm

//go:generate go run ../internal/cmd/fsmgen
