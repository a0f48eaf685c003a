package tasks_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// childEnv marks the process TestDefaultLoggerWarnsOnStderr starts.
const childEnv = "ARBOR_TEST_DEFAULT_LOGGER_CHILD"

// An engine configured with no Logger says its warnings on standard error:
// New's warning about a transaction-mode pooler with no ListenPool reaches
// the operator instead of being discarded. The test runs itself in a child
// process, whose standard error it reads.
func TestDefaultLoggerWarnsOnStderr(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		pool, schema := testdb.Fresh(t)
		_, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema, TransactionPooler: true})
		require.NoError(t, err)
		return
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestDefaultLoggerWarnsOnStderr$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr, stdout bytes.Buffer
	cmd.Stderr, cmd.Stdout = &stderr, &stdout
	require.NoError(t, cmd.Run(), "the child: %s%s", stdout.String(), stderr.String())
	require.Contains(t, stderr.String(), "level=WARN")
	require.Contains(t, stderr.String(), "no Config.ListenPool")
	require.NotContains(t, stdout.String(), "no Config.ListenPool", "warnings go to standard error only")

	cfg := (&tasks.Config{}).WithDefaults()
	require.True(t, cfg.Logger.Enabled(context.Background(), slog.LevelWarn))
	require.False(t, cfg.Logger.Enabled(context.Background(), slog.LevelInfo), "the default says warnings and errors only")
}
