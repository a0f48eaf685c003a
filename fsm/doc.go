// Package fsm holds arbor's task state machine: the statuses a task can be
// in, the events that move it, and the one transition table (docs/design.md §2) that
// every status write in arbor is validated against.
//
// The table is defined once, here, with github.com/looplab/fsm. Everything
// else is derived from it: the engine asks [Transition] before it writes a
// status, the database trigger that refuses impossible histories is generated
// from [Edges] (see [GuardSQL]), and docs/state-machine.md is generated from
// the same table (see [Mermaid]). Tests keep the generated files in sync.
//
// The package is pure: no I/O, no database, no clock.
package fsm
