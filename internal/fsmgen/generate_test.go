package fsmgen_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/fsmgen"
)

// TestGeneratedFilesUpToDate fails when fsm's rules changed and `go
// generate ./fsm` was not run: the docs diagram and the guards written
// into the migrations must be the rules' own.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	want, err := fsmgen.Files(filepath.Join("..", ".."))
	require.NoError(t, err)
	for path, content := range want {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, content, string(got), "%s is out of date: run go generate ./fsm", path)
	}
}
