package machine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// awaitingTurns is a "turn" handler that awaits the event "go" and, woken,
// counts its entry and completes; parked says (by conversation) that its
// await is parked.
type awaitingTurns struct {
	mu     sync.Mutex
	parked map[string]chan struct{}
	woken  map[int64]int
}

func newAwaitingTurns() *awaitingTurns {
	return &awaitingTurns{parked: map[string]chan struct{}{}, woken: map[int64]int{}}
}

func (a *awaitingTurns) parkedIn(conv string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.parked[conv] == nil {
		a.parked[conv] = make(chan struct{}, 1)
	}
	return a.parked[conv]
}

func (a *awaitingTurns) wokenCount(id int64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.woken[id]
}

func (a *awaitingTurns) handler(ctx context.Context, run *machine.Run) error {
	if run.Task.Phase == "woken" {
		a.mu.Lock()
		a.woken[run.Task.ID]++
		a.mu.Unlock()
		return run.Complete(ctx, nil)
	}
	err := run.AwaitEvent(ctx, machine.AwaitParams{Name: "go", Phase: "woken"})
	if err == nil {
		a.parkedIn(run.Task.ConversationID) <- struct{}{}
	}
	return err
}

// startedWithEvent says whether the task's newest running entry was
// written by the transaction that wrote the conversation's newest event
// entry: the emit claimed the task it woke.
func (b *bundle) startedWithEvent(t *testing.T, conv string, taskID int64) bool {
	t.Helper()
	var same bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
		(SELECT xmin::text FROM `+b.schema+`.conversation_log WHERE conversation_id = $1 AND kind = 'event' ORDER BY seq DESC LIMIT 1) =
		(SELECT xmin::text FROM `+b.schema+`.conversation_log WHERE conversation_id = $1 AND task_id = $2 AND kind = 'status' AND status = 'running' ORDER BY seq DESC LIMIT 1)`,
		conv, taskID).Scan(&same))
	return same
}

// TestAnEmitStartsTheTaskItWoke (docs/design.md §3.18, "A wake by an
// event"): Emit and EmitToken in the process whose runner holds the
// conversation start the task their delivery woke in their own
// transaction — its running entry has the event's transaction — and the
// handler is entered once; EmitTx (the caller commits) leaves the task
// pending for the runner's claim, in a transaction of its own.
func TestAnEmitStartsTheTaskItWoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turns := newAwaitingTurns()
	fastRunner(t, b, map[string]machine.Handler{"turn": turns.handler}, func(c *machine.RunnerConfig) {
		c.IdleRelease = time.Hour // the conversations stay held
	})
	parked := func(conv string) arbortype.Task {
		turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		require.NoError(t, err)
		select {
		case <-turns.parkedIn(conv):
		case <-time.After(30 * time.Second):
			t.Fatalf("the turn of %s never parked", conv)
		}
		return turn
	}
	woken := func(conv string, id int64) {
		waitUntil(t, "the woken turn to complete", func() bool { return b.get(t, id).Status == arbortype.StatusCompleted })
		require.Equal(t, 1, turns.wokenCount(id), "entered once, woken")
		require.Zero(t, b.get(t, id).Attempt)
	}

	// The grant is refused while the runner's audit holds its claim lock
	// (a moment now and then): then the producer claims, and the next
	// conversation is tried.
	for _, how := range []string{"name", "token"} {
		folded := false
		for i := 0; i < 10 && !folded; i++ {
			conv := fmt.Sprintf("%s-%s-%d", b.conv, how, i)
			turn := parked(conv)
			var err error
			if how == "name" {
				_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: conv, TaskID: turn.ID, Name: "go"})
			} else {
				var pending []arbortype.PendingEvent
				pending, err = b.engine.PendingEvents(b.ctx, conv)
				require.NoError(t, err)
				require.Len(t, pending, 1)
				_, _, err = b.engine.EmitToken(b.ctx, pending[0].Token, nil)
			}
			require.NoError(t, err)
			woken(conv, turn.ID)
			folded = b.startedWithEvent(t, conv, turn.ID)
			b.requireClean(t, conv)
		}
		require.True(t, folded, "an emit by %s started the task it woke", how)
	}

	// EmitTx: the caller's transaction; the runner's claim starts the task.
	conv := b.conv + "-tx"
	turn := parked(conv)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, _, err = b.engine.EmitTx(b.ctx, tx, tasks.EmitParams{ConversationID: conv, TaskID: turn.ID, Name: "go"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	woken(conv, turn.ID)
	require.False(t, b.startedWithEvent(t, conv, turn.ID), "EmitTx claims nothing")
	b.requireClean(t, conv)
}

// TestAnEmitWhoseAnswerIsLostRunsOnce: the connection of an Emit that
// claimed the task it woke dies once the server has committed, before the
// client reads the answer. The caller gets ErrAmbiguous; the runner finds
// that the transaction committed and adopts the run it claimed: the
// handler is entered once, under the emit's claim (no requeue, no second
// claim, no restart counted).
func TestAnEmitWhoseAnswerIsLostRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turns := newAwaitingTurns()
	// Cut at the first idle ReadyForQuery after the event's insert: the
	// answer to the emit's COMMIT.
	engine, armed := cutRunner(t, b, ".events (conversation_id, task_id, name, payload", map[string]machine.Handler{"turn": turns.handler})

	folded := false
	for i := 0; i < 10 && !folded; i++ {
		conv := fmt.Sprintf("%s-%d", b.conv, i)
		turn, _, err := engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		require.NoError(t, err)
		select {
		case <-turns.parkedIn(conv):
		case <-time.After(30 * time.Second):
			t.Fatalf("the turn of %s never parked", conv)
		}
		armed.Store(true)
		_, _, err = engine.Emit(b.ctx, tasks.EmitParams{ConversationID: conv, TaskID: turn.ID, Name: "go"})
		require.ErrorIs(t, err, arbortype.ErrAmbiguous)
		require.False(t, armed.Load(), "the answer was cut")
		waitUntil(t, "the woken turn to complete", func() bool { return b.get(t, turn.ID).Status == arbortype.StatusCompleted })
		require.Equal(t, 1, turns.wokenCount(turn.ID), "entered once, woken")
		require.Zero(t, b.get(t, turn.ID).Attempt, "no restart counted")
		// After the event: woken (pending), started, completed — one start.
		entries, err := b.engine.ReadLog(b.ctx, conv, 0, 100)
		require.NoError(t, err)
		var after []arbortype.Status
		seen := false
		for _, e := range entries {
			seen = seen || e.Kind == arbortype.LogKindEvent
			if seen && e.Kind == arbortype.LogKindStatus && e.TaskID == turn.ID {
				after = append(after, e.Status)
			}
		}
		require.Equal(t, []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusCompleted}, after)
		folded = b.startedWithEvent(t, conv, turn.ID)
		b.requireClean(t, conv)
	}
	require.True(t, folded, "an emit whose answer was lost started the task it woke")
}
