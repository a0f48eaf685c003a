package machine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// eventually bounds every wait of the package's internal tests: a wait
// for a signal, never a measure of speed.
const eventually = 45 * time.Second

// internalRunner is a started runner of an internal test, on a schema of
// the test's own (testdb.Fresh: a runner in the shared schema would take
// other tests' conversations), with the settings these tests share and
// cfg's changes, stopped when the test ends.
type internalRunner struct {
	r      *Runner
	eng    *enginetest.Engine
	pool   *pgxpool.Pool
	schema string
	conv   string
}

func startInternalRunner(t *testing.T, handlers map[string]Handler, cfg func(*RunnerConfig)) internalRunner {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	c := &RunnerConfig{
		ConversationLease: 5 * time.Second,
		PollInterval:      50 * time.Millisecond,
		ShutdownGrace:     2 * time.Second,
		Waker:             &WakerConfig{RiverTestOnly: true},
	}
	if cfg != nil {
		cfg(c)
	}
	r, err := NewRunner(eng.Engine, handlers, c)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(stopCtx))
	})
	return internalRunner{r: r, eng: eng, pool: pool, schema: schema, conv: testdb.Conversation(t)}
}

// waitFor waits until cond holds, looking every 10 ms, and fails the test
// after eventually.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(10 * time.Millisecond)
	}
}
