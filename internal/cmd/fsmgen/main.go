// Command fsmgen writes the files generated from fsm's transition table,
// column rules and record rules (internal/fsmgen.Files):
// docs/state-machine.md, and the current guards whole into the newest
// migration that holds their regions. Run it with `go generate ./fsm` from
// the repository root.
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
	files, err := fsmgen.Files(root)
	if err != nil {
		log.Fatal(err)
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
