package machine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/reconcile"
)

// logRecorder is a slog handler that keeps every record's message.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// TestStoppedRunnerWritesNothing: a handler that ignores its cancelled
// context outlives Stop. Stop does not release its conversation (another
// node would run the task while the handler still runs here): the task
// stays running under the node's lease, which lapses. What the handler
// writes after the stop — a checkpoint, its nil return that would complete
// the task — is refused, and nothing lands.
func TestStoppedRunnerWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered, unblock := make(chan struct{}), make(chan struct{})
	late := make(chan error, 1)
	r, err := machine.NewRunner(b.engine.Engine, map[string]machine.Handler{
		"stubborn": func(ctx context.Context, run *machine.Run) error {
			close(entered)
			<-unblock // ignores ctx
			late <- run.Checkpoint(context.Background(), "after the stop", nil)
			return nil // the runner would complete the task for it
		},
	}, &machine.RunnerConfig{ConversationLease: time.Minute, PollInterval: 50 * time.Millisecond, ShutdownGrace: 50 * time.Millisecond,
		Waker: &machine.WakerConfig{RiverTestOnly: true}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "stubborn"})
	require.NoError(t, err)
	<-entered

	err = r.Stop(context.Background())
	require.ErrorContains(t, err, fmt.Sprintf("tasks [%d] ignored their cancelled context", task.ID), "Stop names the handler that outlived it")
	got := b.get(t, task.ID)
	require.Equal(t, arbortype.StatusRunning, got.Status, "still the stubborn run's: no other run may start while it runs")
	conv, err := b.engine.Conversation(b.ctx, b.conv)
	require.NoError(t, err)
	require.Equal(t, r.NodeID(), conv.Holder, "not released: it lapses with the node's lease")
	before := snapshot(t, b)
	close(unblock)
	require.ErrorIs(t, <-late, machine.ErrShutdown, "the stopped runner's handler cannot write")
	require.Empty(t, r.Held(), "a stopped runner holds nothing of its own accord")
	require.Equal(t, before, snapshot(t, b), "nothing of the stopped runner landed")
	b.requireClean(t)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// TestRunnerReleasesWithoutFalseWarnings: conversations released as soon
// as they are idle, with leases renewed several times a second: no release
// is mistaken for a take-over. And while every worker is busy, the runner
// opens no more conversations (it would hold leases it has no worker for,
// which another node could run); once a worker is free each is opened with
// its work claimed in the same transaction, never released idle with it
// not run (each is opened once).
func TestRunnerReleasesWithoutFalseWarnings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &logRecorder{}
	var mu sync.Mutex
	opened := map[string]int{}
	gate := make(chan struct{})
	var once sync.Once
	r, err := machine.NewRunner(b.engine.Engine, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			once.Do(func() { <-gate }) // the first holds the only worker
			return run.Complete(ctx, nil)
		},
	}, &machine.RunnerConfig{Workers: 1, ConversationLease: 3 * time.Second, PollInterval: 20 * time.Millisecond,
		IdleRelease: time.Millisecond, Logger: slog.New(logs), Waker: &machine.WakerConfig{RiverTestOnly: true},
		OnReconcile: func(rep reconcile.Report) {
			mu.Lock()
			opened[rep.ConversationID]++
			mu.Unlock()
		}})
	require.NoError(t, err)
	require.NoError(t, r.Start(b.ctx))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })
	const n = 20
	var convs []string
	for i := range n {
		conv := fmt.Sprintf("%s-%02d", b.conv, i)
		convs = append(convs, conv)
		_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		require.NoError(t, err)
	}
	waitUntil(t, "the first conversation to be opened", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(opened) >= 1
	})
	// (A lease of seconds: beside a second make test, a 300 ms lease's
	// fence fired by starvation and lapsed the conversation before this.)
	require.Len(t, r.Held(), 1, "no conversation is opened without a free worker")
	close(gate)
	for _, conv := range convs {
		waitUntil(t, "every turn to complete", func() bool {
			all, err := b.engine.ConversationTasks(b.ctx, conv)
			require.NoError(t, err)
			return all[0].Status == arbortype.StatusCompleted
		})
	}
	waitUntil(t, "every conversation to be released", func() bool { return len(r.Held()) == 0 })
	mu.Lock()
	for _, conv := range convs {
		require.Equal(t, 1, opened[conv], "%s was opened once: never released with its work not run", conv)
	}
	mu.Unlock()
	require.Zero(t, logs.count("lease lost"), "a release is not a take-over")
	b.requireClean(t, convs...)
}
