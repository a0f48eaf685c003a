// Command fsmgen writes the files generated from fsm's transition table,
// column rules and record rules (internal/fsmgen.Files):
// docs/state-machine.md; the latest guard whole in migrations/guard/ and
// the latest record guards in migrations/records/, the older versions of
// each as patches on it (internal/guardhistory); and the two files of each
// one's latest migration (fsmgen.GuardMigration, fsmgen.RecordMigration; a
// file written by hand, fsmgen.RecordMigrationByHand, is left alone). Run it with `go generate ./fsm`
// from the repository root.
package main

import (
	"log"
	"os"

	"github.com/arborhq/arbor/internal/fsmgen"
)

func main() {
	// go generate runs in the package directory (fsm/); the files live beside it.
	root := ".."
	if _, err := os.Stat("go.mod"); err == nil {
		root = "."
	}
	files, held, err := fsmgen.Files(root)
	if err != nil {
		log.Fatal(err)
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	// A version that was the newest is now a patch: its whole file goes.
	for _, path := range held {
		if _, ok := files[path]; !ok {
			if err := os.Remove(path); err != nil {
				log.Fatal(err)
			}
		}
	}
}
