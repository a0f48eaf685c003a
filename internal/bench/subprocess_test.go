package bench

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A subprocess module that cannot be built leaves its subjects out with the
// reason, which the table shows; none of these needs a database.
func TestBuildSubprocessSaysWhyNot(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	ctx := context.Background()

	p, why := buildSubprocess(ctx, goWorkflowsModule, "", logger)
	require.Nil(t, p)
	require.Equal(t, "not run: no internal/bench/goworkflows directory given (--goworkflows-dir)", why)

	p, why = buildSubprocess(ctx, goWorkflowsModule, t.TempDir(), logger)
	require.Nil(t, p)
	require.Contains(t, why, "go.mod not found")

	broken := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(broken, "go.mod"), []byte("module broken\n\ngo 1.26.0\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(broken, "main.go"), []byte("package main\n\nfunc main() { undefinedCall() }\n"), 0o644))
	p, why = buildSubprocess(ctx, goWorkflowsModule, broken, logger)
	require.Nil(t, p)
	require.Contains(t, why, "could not build internal/bench/goworkflows (go-workflows)")
	require.Contains(t, why, "undefinedCall")
}

// Every subject that runs in a subprocess names a module the harness
// builds, so that it is built when wanted and says why not otherwise.
func TestSubprocessSubjectsNameAModule(t *testing.T) {
	t.Parallel()
	known := map[string]bool{dbosModule.key: true, goWorkflowsModule.key: true}
	seen := map[string]bool{}
	for _, s := range Scenarios() {
		for _, sub := range s.Subjects {
			if sub.Subprocess != "" {
				require.True(t, known[sub.Subprocess], "%s/%s: module %q", s.Key, sub.Key, sub.Subprocess)
				seen[sub.Subprocess] = true
			}
		}
	}
	require.Equal(t, known, seen, "every module has a subject")
	require.True(t, wantsSubprocess(&Options{Only: []string{"h"}}, goWorkflowsModule.key))
	require.False(t, wantsSubprocess(&Options{Only: []string{"b"}}, goWorkflowsModule.key), "(b) has no go-workflows subject")
	require.True(t, wantsSubprocess(&Options{Only: []string{"b"}}, dbosModule.key))
}
