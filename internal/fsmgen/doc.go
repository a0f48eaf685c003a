// Package fsmgen writes what is generated from package fsm's rules: the
// tasks' and conversations' guard (GuardSQL), the record guards
// (RecordGuardSQL), the files of their latest migrations, and
// docs/state-machine.md (Mermaid). internal/cmd/fsmgen writes them
// (`go generate ./fsm`), keeping older versions as patches
// (internal/guardhistory); a test fails when they are out of date.
package fsmgen
