// Command fsmgen writes the files generated from fsm's transition table and
// column rules: docs/state-machine.md and the latest guard migration
// (migrations/sql/<fsm.GuardMigration>.up.sql and .down.sql). Run it with
// `go generate ./fsm` from the repository root.
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
	sql := filepath.Join(root, "migrations", "sql")
	previous, err := os.ReadFile(filepath.Join(sql, fsm.PreviousGuard+".up.sql"))
	if err != nil {
		log.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(root, "docs", "state-machine.md"):    fsm.Mermaid(),
		filepath.Join(sql, fsm.GuardMigration+".up.sql"):   fsm.GuardSQL(),
		filepath.Join(sql, fsm.GuardMigration+".down.sql"): fsm.GuardDownSQL(string(previous)),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
