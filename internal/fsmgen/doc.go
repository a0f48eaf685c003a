// Package fsmgen writes what is generated from package fsm's rules: the
// tasks' and conversations' guard (GuardSQL), the record guards
// (RecordGuardSQL), and docs/state-machine.md (Mermaid). Each guard is
// written whole into the newest migration that holds its region, between
// a BEGIN and an END line (Files); internal/cmd/fsmgen writes them (`go
// generate ./fsm`), and a test fails when they are out of date. A change
// to the rules therefore comes with a new migration whose up file holds
// the regions (and whose down file may hold them too, to restore the
// previous text): the migrations stay plain SQL.
package fsmgen
