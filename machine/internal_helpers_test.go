package machine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
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

// task reads task id through the engine.
func (ir internalRunner) task(t *testing.T, id int64) arbortype.Task {
	t.Helper()
	got, err := ir.eng.Get(context.Background(), id)
	require.NoError(t, err)
	return got
}

// holdIdle has the runner hold the test's conversation, with nothing
// running in it: a task of kind "turn" (whose handler must complete it)
// is created and run to its end. The runner's IdleRelease must keep the
// conversation held while idle.
func (ir internalRunner) holdIdle(t *testing.T) {
	t.Helper()
	turn, _, err := ir.eng.Create(context.Background(), arbortype.CreateParams{ConversationID: ir.conv, Kind: "turn"})
	require.NoError(t, err)
	waitFor(t, "the turn to complete", func() bool { return ir.task(t, turn.ID).Status == arbortype.StatusCompleted })
	waitFor(t, "the conversation to be held", func() bool {
		ir.r.mu.Lock()
		defer ir.r.mu.Unlock()
		return ir.r.held[ir.conv] != nil
	})
}
