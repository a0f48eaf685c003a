package fsmgen_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/fsmgen"
	"github.com/arborhq/arbor/internal/guardhistory"
)

// TestGeneratedFilesUpToDate fails when fsm.go changed and `go generate
// ./fsm` was not run: the docs diagram, the database guard and its history
// must be the table's own.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	want := map[string]string{filepath.Join("..", "..", "docs", "state-machine.md"): fsmgen.Mermaid()}
	sql := filepath.Join("..", "..", "migrations", "sql")
	for _, h := range []struct {
		dir, migration, text string
	}{
		{"guard", fsmgen.GuardMigration, fsmgen.GuardSQL()},
		{"records", fsmgen.RecordMigration, fsmgen.RecordGuardSQL()},
	} {
		dir := filepath.Join("..", "..", "migrations", h.dir)
		version, err := strconv.Atoi(h.migration[:3])
		require.NoError(t, err)
		history, err := guardhistory.Regenerate(dir, version, h.text)
		require.NoError(t, err)
		held, err := filepath.Glob(filepath.Join(dir, "*"))
		require.NoError(t, err)
		for _, path := range held {
			_, ok := history[path]
			require.True(t, ok, "%s is stale: run go generate ./fsm", path)
		}
		maps.Copy(want, history)
		// The down file restores the version before the newest: the
		// constant that names it must name that one.
		previous := 0
		for path := range history {
			if v, err := strconv.Atoi(filepath.Base(path)[:3]); err == nil && v < version {
				previous = max(previous, v)
			}
		}
		wantPrevious := map[string]string{"guard": fsmgen.PreviousGuard, "records": fsmgen.PreviousRecords}[h.dir]
		if previous == 0 {
			require.Empty(t, wantPrevious, "%s: no version before %03d, so no previous one to name", h.dir, version)
		} else {
			require.NotEmpty(t, wantPrevious, "%s: the version before %03d is %03d", h.dir, version, previous)
			require.Equal(t, fmt.Sprintf("%03d", previous), wantPrevious[:3], "%s: the previous version of %03d", h.dir, version)
		}
	}
	want[filepath.Join(sql, fsmgen.GuardMigration+".up.sql")] = fsmgen.GuardUpSQL()
	want[filepath.Join(sql, fsmgen.GuardMigration+".down.sql")] = fsmgen.GuardDownSQL()
	want[filepath.Join(sql, fsmgen.RecordMigration+".up.sql")] = fsmgen.RecordUpSQL()
	if fsmgen.PreviousRecords != "" {
		want[filepath.Join(sql, fsmgen.RecordMigration+".down.sql")] = fsmgen.RecordDownSQL()
	}
	for path, content := range want {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, content, string(got), "%s is out of date: run go generate ./fsm", path)
	}
}
