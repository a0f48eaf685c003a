// Package fsm holds arbor's task state machine: the statuses a task can be
// in, the events that move it, and the one transition table (docs/design.md
// §2) that every status write in arbor is validated against. Ask
// [Transition] whether an event is allowed from a status; [Edges] lists
// the table; a refused transition is a [*TransitionError], which matches
// arbortype.ErrInvalidTransition.
//
// The table is defined once, here, with github.com/looplab/fsm. Everything
// else is derived from it: the engine asks [Transition] before it writes a
// status, and the database triggers that refuse impossible histories and
// forged records are generated from it and from the rules of
// internal/guardrules, and so is docs/state-machine.md (internal/fsmgen;
// `go generate ./fsm`). Tests keep the generated files in sync.
//
// The package is pure: no I/O, no database, no clock.
package fsm

//go:generate go run ../internal/cmd/fsmgen
