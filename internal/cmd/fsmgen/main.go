// Command fsmgen writes the files generated from fsm's transition table and
// column rules: docs/state-machine.md, the latest guard whole in
// migrations/guard/ with the older ones as patches on it
// (internal/guardhistory), and the latest guard migration's two files
// (migrations/sql/<fsm.GuardMigration>.up.sql and .down.sql). Run it with
// `go generate ./fsm` from the repository root.
package main

import (
	"log"
	"os"
	"path/filepath"
	"strconv"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/guardhistory"
)

func main() {
	// go generate runs in the package directory (fsm/); the files live beside it.
	root := ".."
	if _, err := os.Stat("go.mod"); err == nil {
		root = "."
	}
	sql := filepath.Join(root, "migrations", "sql")
	guards := filepath.Join(root, "migrations", "guard")
	version, err := strconv.Atoi(fsm.GuardMigration[:3])
	if err != nil {
		log.Fatal(err)
	}
	files, err := guardhistory.Regenerate(guards, version, fsm.GuardSQL())
	if err != nil {
		log.Fatal(err)
	}
	stale, err := filepath.Glob(filepath.Join(guards, "*"))
	if err != nil {
		log.Fatal(err)
	}
	files[filepath.Join(root, "docs", "state-machine.md")] = fsm.Mermaid()
	files[filepath.Join(sql, fsm.GuardMigration+".up.sql")] = fsm.GuardUpSQL()
	files[filepath.Join(sql, fsm.GuardMigration+".down.sql")] = fsm.GuardDownSQL()
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	// The guard that was the newest is now a patch: its whole file goes.
	for _, path := range stale {
		if _, ok := files[path]; !ok {
			if err := os.Remove(path); err != nil {
				log.Fatal(err)
			}
		}
	}
}
