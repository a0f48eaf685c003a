package machine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// TestNewRunnerRefusesBadConfig (issue 24): every field NewRunner checks
// is refused with ErrInvalidArgument and a message naming it, before
// anything connects or is written: a NodeID that PostgreSQL's text cannot
// hold (a NUL, invalid UTF-8) or that is too long, each bound of the
// numbers, a nil middleware, a nil engine, no handlers, a bad waker.
func TestNewRunnerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	handlers := map[string]machine.Handler{"turn": func(context.Context, *machine.Run) error { return nil }}
	for _, c := range []struct {
		name, want string
		cfg        machine.RunnerConfig
	}{
		{"a NUL in the node id", "NodeID", machine.RunnerConfig{NodeID: "node\x00a"}},
		{"a node id of invalid UTF-8", "NodeID", machine.RunnerConfig{NodeID: "node\xff"}},
		{"a node id of 201 bytes", "NodeID", machine.RunnerConfig{NodeID: strings.Repeat("n", 201)}},
		{"a negative capacity", "Capacity", machine.RunnerConfig{Capacity: -1}},
		{"a negative worker count", "Workers", machine.RunnerConfig{Workers: -1}},
		{"65 flushers", "Flushers", machine.RunnerConfig{Flushers: 65}},
		{"a batch of 10,001", "MaxBatch", machine.RunnerConfig{MaxBatch: 10_001}},
		{"a 50 ms lease", "ConversationLease", machine.RunnerConfig{ConversationLease: 50 * time.Millisecond}},
		{"a negative poll interval", "PollInterval", machine.RunnerConfig{PollInterval: -time.Second}},
		{"a negative idle release", "IdleRelease", machine.RunnerConfig{IdleRelease: -time.Second}},
		{"a nil middleware", "Middleware[1]", machine.RunnerConfig{Middleware: []machine.Middleware{passThrough{}, nil}}},
		{"a waker polling below 1 ms", "WakerConfig.PollInterval", machine.RunnerConfig{Waker: &machine.WakerConfig{PollInterval: time.Microsecond}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := machine.NewRunner(eng.Engine, handlers, &c.cfg)
			require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
			require.ErrorContains(t, err, c.want)
			require.Nil(t, r)
		})
	}
	_, err := machine.NewRunner(nil, handlers, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "a nil engine")
	_, err = machine.NewRunner(eng.Engine, nil, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "no handlers")
	r, err := machine.NewRunner(eng.Engine, handlers, &machine.RunnerConfig{NodeID: "node-é-1"})
	require.NoError(t, err, "a node id of valid UTF-8 text is taken")
	require.NotNil(t, r)
}

// passThrough is a middleware that only calls next.
type passThrough struct{}

func (passThrough) Run(ctx context.Context, _ *machine.Run, next func(context.Context) machine.Outcome) {
	next(ctx)
}
