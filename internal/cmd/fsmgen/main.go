// Command fsmgen writes the files generated from fsm's transition table,
// column rules and record rules: docs/state-machine.md; the latest guard
// whole in migrations/guard/ and the latest record guards in
// migrations/records/, the older versions of each as patches on it
// (internal/guardhistory); and the two files of each one's latest
// migration (fsmgen.GuardMigration, fsmgen.RecordMigration; a down file written
// by hand is left alone). Run it with `go generate ./fsm` from the
// repository root.
package main

import (
	"log"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	"github.com/arborhq/arbor/internal/fsmgen"
	"github.com/arborhq/arbor/internal/guardhistory"
)

func main() {
	// go generate runs in the package directory (fsm/); the files live beside it.
	root := ".."
	if _, err := os.Stat("go.mod"); err == nil {
		root = "."
	}
	sql := filepath.Join(root, "migrations", "sql")
	files := map[string]string{filepath.Join(root, "docs", "state-machine.md"): fsmgen.Mermaid()}
	var stale []string
	for _, h := range []struct {
		dir, migration, up, down string
	}{
		{"guard", fsmgen.GuardMigration, fsmgen.GuardUpSQL(), fsmgen.GuardDownSQL()},
		{"records", fsmgen.RecordMigration, fsmgen.RecordUpSQL(), recordDown()},
	} {
		dir := filepath.Join(root, "migrations", h.dir)
		version, err := strconv.Atoi(h.migration[:3])
		if err != nil {
			log.Fatal(err)
		}
		text := fsmgen.GuardSQL()
		if h.dir == "records" {
			text = fsmgen.RecordGuardSQL()
		}
		history, err := guardhistory.Regenerate(dir, version, text)
		if err != nil {
			log.Fatal(err)
		}
		held, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil {
			log.Fatal(err)
		}
		stale = append(stale, held...)
		maps.Copy(files, history)
		files[filepath.Join(sql, h.migration+".up.sql")] = h.up
		if h.down != "" {
			files[filepath.Join(sql, h.migration+".down.sql")] = h.down
		}
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	// A version that was the newest is now a patch: its whole file goes.
	for _, path := range stale {
		if _, ok := files[path]; !ok {
			if err := os.Remove(path); err != nil {
				log.Fatal(err)
			}
		}
	}
}

// recordDown is the record migration's down file when the guards it
// replaces were generated; "" (the file is written by hand) when not.
func recordDown() string {
	if fsmgen.PreviousRecords == "" {
		return ""
	}
	return fsmgen.RecordDownSQL()
}
