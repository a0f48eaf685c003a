// Command fsmgen writes the files generated from fsm's transition table:
// docs/state-machine.md and migrations/sql/002_transition_guard.up.sql.
// Run it with `go generate ./fsm` from the repository root.
package main

import (
	"log"
	"os"
	"path/filepath"

	"github.com/arborhq/arbor/fsm"
)

func main() {
	// go generate runs in the package directory (fsm/); the files live beside it.
	root := ".."
	if _, err := os.Stat("go.mod"); err == nil {
		root = "."
	}
	files := map[string]string{
		filepath.Join(root, "docs", "state-machine.md"):                         fsm.Mermaid(),
		filepath.Join(root, "migrations", "sql", "002_transition_guard.up.sql"): fsm.GuardSQL(),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
