package fsmgen

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/arborhq/arbor/internal/guardhistory"
)

// History is one generated history: its folder under migrations/, the
// migration that applies its newest version, and that version's text.
type History struct {
	Dir, Migration, Text string
	// Previous names the migration of the version before (PreviousGuard,
	// PreviousRecords): "" when there is none generated.
	Previous string
}

// Histories are the two generated histories: the tasks' and
// conversations' guard, and the record guards.
func Histories() []History {
	return []History{
		{Dir: "guard", Migration: GuardMigration, Text: GuardSQL(), Previous: PreviousGuard},
		{Dir: "records", Migration: RecordMigration, Text: RecordGuardSQL(), Previous: PreviousRecords},
	}
}

// Files returns every file `go generate ./fsm` writes, by path under root
// (the repository), with its content; and held, the files the history
// folders hold now (those not among files are stale: a version that was
// the newest and is now a patch). internal/cmd/fsmgen writes them, and
// TestGeneratedFilesUpToDate compares them with the repository.
func Files(root string) (files map[string]string, held []string, err error) {
	sql := filepath.Join(root, "migrations", "sql")
	files = map[string]string{filepath.Join(root, "docs", "state-machine.md"): Mermaid()}
	for _, h := range Histories() {
		dir := filepath.Join(root, "migrations", h.Dir)
		version, err := strconv.Atoi(h.Migration[:3])
		if err != nil {
			return nil, nil, err
		}
		history, err := guardhistory.Regenerate(dir, version, h.Text)
		if err != nil {
			return nil, nil, err
		}
		now, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil {
			return nil, nil, err
		}
		held = append(held, now...)
		maps.Copy(files, history)
	}
	files[filepath.Join(sql, GuardMigration+".up.sql")] = GuardUpSQL()
	files[filepath.Join(sql, GuardMigration+".down.sql")] = GuardDownSQL()
	switch {
	case RecordMigrationByHand:
		if err := RecordFilesByHand(sql); err != nil {
			return nil, nil, err
		}
	default:
		files[filepath.Join(sql, RecordMigration+".up.sql")] = RecordUpSQL()
		if PreviousRecords != "" {
			// Else the record migration's down is written by hand.
			files[filepath.Join(sql, RecordMigration+".down.sql")] = RecordDownSQL()
		}
	}
	return files, held, nil
}

// RecordFilesByHand checks RecordMigration's files in the folder sql when
// they are written by hand (RecordMigrationByHand): its up file must apply
// its guards and its down file restore the previous ones, each by its own
// directive line (internal/guardhistory), or the migration would apply
// other guards than guardrules.RecordRules'.
func RecordFilesByHand(sql string) error {
	want := map[string]string{
		RecordMigration + ".up.sql":   "-- arbor:records " + RecordMigration[:3] + "\n",
		RecordMigration + ".down.sql": "-- arbor:records " + (PreviousRecords + "000")[:3] + "\n",
	}
	for name, line := range want {
		body, err := os.ReadFile(filepath.Join(sql, name))
		if err != nil {
			return fmt.Errorf("fsmgen: %s is written by hand (RecordMigrationByHand): %w", name, err)
		}
		if !strings.HasPrefix(string(body), line) && !strings.Contains(string(body), "\n"+line) {
			return fmt.Errorf("fsmgen: %s is written by hand (RecordMigrationByHand) and must hold the line %q", name, strings.TrimSpace(line))
		}
	}
	return nil
}
