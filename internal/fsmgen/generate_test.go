package fsmgen_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/fsmgen"
)

// TestGeneratedFilesUpToDate fails when fsm.go changed and `go generate
// ./fsm` was not run: the docs diagram, the database guard and its history
// must be the table's own.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	want, held, err := fsmgen.Files(root)
	require.NoError(t, err)
	for _, path := range held {
		_, ok := want[path]
		require.True(t, ok, "%s is stale: run go generate ./fsm", path)
	}
	for _, h := range fsmgen.Histories() {
		// The down file restores the version before the newest: the
		// constant that names it must name that one.
		version, err := strconv.Atoi(h.Migration[:3])
		require.NoError(t, err)
		previous := 0
		for path := range want {
			if filepath.Dir(path) != filepath.Join(root, "migrations", h.Dir) {
				continue
			}
			if v, err := strconv.Atoi(filepath.Base(path)[:3]); err == nil && v < version {
				previous = max(previous, v)
			}
		}
		if previous == 0 {
			require.Empty(t, h.Previous, "%s: no version before %03d, so no previous one to name", h.Dir, version)
		} else {
			require.NotEmpty(t, h.Previous, "%s: the version before %03d is %03d", h.Dir, version, previous)
			require.Equal(t, fmt.Sprintf("%03d", previous), h.Previous[:3], "%s: the previous version of %03d", h.Dir, version)
		}
	}
	for path, content := range want {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, content, string(got), "%s is out of date: run go generate ./fsm", path)
	}
}
