package machine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// delivery is what an awaiting handler saw when it ran again.
type delivery struct {
	task      int64
	delivered *arbortype.Delivered
}

// awaitHandlers returns handlers whose "approval" task awaits the event
// "approve" (with timeout) and reports what woke it on got; parked is
// told each time a task is about to park.
func awaitHandlers(timeout time.Duration, parked chan<- int64, got chan<- delivery) map[string]machine.Handler {
	return map[string]machine.Handler{
		"approval": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "decided" {
				got <- delivery{run.Task.ID, run.Task.Delivered}
				return run.Complete(ctx, nil)
			}
			if parked != nil {
				parked <- run.Task.ID
			}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "approve", Timeout: timeout, Phase: "decided"})
		},
	}
}

// No event is lost, in any order: emitted before the await parks (the
// await takes it and the task runs again at once), while it is parked (the
// emit wakes it), and — inngest #1433, an event sent right after the wait
// starts — in a race with the park itself, many times over.
func TestEventsAreNeverLost(t *testing.T) {
	t.Parallel()
	t.Run("before the await", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := make(chan delivery, 1)
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
		require.NoError(t, err)
		_, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approve", Payload: json.RawMessage(`{"ok": true}`)})
		require.NoError(t, err)
		require.True(t, created)
		fastRunner(t, b, awaitHandlers(0, nil, got), nil)
		d := <-got
		require.Equal(t, task.ID, d.task)
		require.NotNil(t, d.delivered)
		require.False(t, d.delivered.TimedOut)
		require.JSONEq(t, `{"ok": true}`, string(d.delivered.Payload))
		waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == arbortype.StatusCompleted })
		b.requireClean(t)
	})
	t.Run("while parked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got := make(chan delivery, 1)
		fastRunner(t, b, awaitHandlers(time.Hour, nil, got), nil)
		task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
		require.NoError(t, err)
		waitUntil(t, "the await to park", func() bool {
			p, err := b.engine.PendingEvents(b.ctx, b.conv)
			require.NoError(t, err)
			return len(p) == 1
		})
		ev, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "approve", Payload: json.RawMessage(`"yes"`)})
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, task.ID, ev.DeliveredTo, "delivered in the emit's transaction")
		d := <-got
		require.JSONEq(t, `"yes"`, string(d.delivered.Payload))
		require.Equal(t, ev.ID, d.delivered.EventID)
		waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == arbortype.StatusCompleted })
		// Its timeout's wake job went with the delivery (the checker
		// counts live jobs per sleep).
		b.requireClean(t)
	})
	t.Run("racing the park", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 30
		parked := make(chan int64, n)
		got := make(chan delivery, n)
		fastRunner(t, b, awaitHandlers(time.Hour, parked, got), nil)
		var convs []string
		for i := range n {
			conv := fmt.Sprintf("%s-%02d", b.conv, i)
			convs = append(convs, conv)
			_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "approval"})
			require.NoError(t, err)
		}
		// Each emit goes out the moment its handler is about to park: the
		// emit and the await's transaction race.
		var wg sync.WaitGroup
		for range n {
			id := <-parked
			wg.Go(func() {
				task, err := b.engine.Get(b.ctx, id)
				if err == nil {
					_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: task.ConversationID, Name: "approve"})
				}
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		for range n {
			d := <-got
			require.False(t, d.delivered.TimedOut, "task %d got its event", d.task)
		}
		b.requireClean(t, convs...)
	})
}

// An await with a timeout ends by it, durably (the wake job and the local
// timer), and the handler is told; an event emitted after the timeout waits
// for the next await of its name.
func TestAwaitTimesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan delivery, 1)
	fastRunner(t, b, awaitHandlers(50*time.Millisecond, nil, got), nil)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
	require.NoError(t, err)
	d := <-got
	require.Equal(t, task.ID, d.task)
	require.True(t, d.delivered.TimedOut)
	require.Equal(t, "approve", d.delivered.Name)
	waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == arbortype.StatusCompleted })
	ev, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approve", Queue: true})
	require.NoError(t, err)
	require.True(t, created)
	require.Zero(t, ev.DeliveredTo, "no await: it waits")
	b.requireClean(t)
}

// First emit wins by default; with Queue every emit is a delivery of its
// own, taken by the awaits in order; an idempotency key makes a repeat one
// emit.
func TestEmitPolicies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	fastRunner(t, b, map[string]machine.Handler{
		"listener": func(ctx context.Context, run *machine.Run) error {
			if d := run.Task.Delivered; d != nil {
				mu.Lock()
				seen = append(seen, string(d.Payload))
				n := len(seen)
				mu.Unlock()
				if n == 3 {
					close(done)
					return run.Complete(ctx, nil)
				}
			}
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: "msg"})
		},
	}, nil)
	first, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv + "-x", Name: "decision", Payload: json.RawMessage(`1`)})
	require.ErrorIs(t, err, arbortype.ErrNotFound, "no such conversation")
	require.False(t, created)
	require.Zero(t, first.ID)

	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "listener"})
	require.NoError(t, err)
	first, created, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "decision", Payload: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.True(t, created)
	second, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "decision", Payload: json.RawMessage(`2`)})
	require.NoError(t, err)
	require.False(t, created, "the first emit of a name wins")
	require.Equal(t, first.ID, second.ID)

	for i, payload := range []string{`"a"`, `"b"`, `"c"`} {
		_, created, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "msg",
			Payload: json.RawMessage(payload), Queue: true, IdempotencyKey: fmt.Sprint("m", i)})
		require.NoError(t, err)
		require.True(t, created)
		_, created, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "msg",
			Payload: json.RawMessage(payload), Queue: true, IdempotencyKey: fmt.Sprint("m", i)})
		require.NoError(t, err)
		require.False(t, created, "a repeated key is one emit")
	}
	<-done
	mu.Lock()
	require.Equal(t, []string{`"a"`, `"b"`, `"c"`}, seen, "queued events in order, each once")
	mu.Unlock()
	b.requireClean(t)
}

// A task that awaits a first-wins name twice (an approval asked for twice)
// gets two answers: an emit while the second await is parked is its answer,
// although the name was emitted before. With no await parked, a repeated
// emit returns the decision already made (a second click), the newest one.
func TestFirstWinsAnswersEachAwait(t *testing.T) {
	t.Parallel()
	for _, toTask := range []bool{false, true} {
		t.Run(fmt.Sprintf("to the task %t", toTask), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "refund"})
			require.NoError(t, err)
			lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			emit := func(payload string) (arbortype.Event, bool) {
				t.Helper()
				p := tasks.EmitParams{ConversationID: b.conv, Name: "approval", Payload: json.RawMessage(payload)}
				if toTask {
					p.TaskID = task.ID
				}
				ev, created, err := b.engine.Emit(b.ctx, p)
				require.NoError(t, err)
				return ev, created
			}
			await := func() {
				t.Helper()
				run, err := lease.Start(b.ctx, task.ID)
				require.NoError(t, err)
				require.NoError(t, run.AwaitEvent(b.ctx, machine.AwaitParams{Name: "approval", Phase: "decided"}))
			}
			delivered := func() string {
				t.Helper()
				cur, err := b.engine.Get(b.ctx, task.ID)
				require.NoError(t, err)
				require.Equal(t, arbortype.StatusPending, cur.Status, "woken by the answer")
				return string(cur.Delivered.Payload)
			}

			await()
			first, created := emit(`1`)
			require.True(t, created)
			require.Equal(t, task.ID, first.DeliveredTo)
			again, created := emit(`2`)
			require.False(t, created, "a second click while nothing awaits returns the decision")
			require.Equal(t, first.ID, again.ID)
			require.Equal(t, `1`, delivered())

			await() // the handler asks again
			second, created := emit(`3`)
			require.True(t, created, "an emit while an await of the name is parked answers it")
			require.Equal(t, task.ID, second.DeliveredTo)
			require.Equal(t, `3`, delivered())
			again, created = emit(`4`)
			require.False(t, created)
			require.Equal(t, second.ID, again.ID, "a repeat returns the newest decision")
			evs, err := b.engine.Events(b.ctx, b.conv, 0, 10)
			require.NoError(t, err)
			require.Len(t, evs, 2)
			b.requireClean(t)
		})
	}
}

// An approval deep in a sub-agent is visible at the conversation's level
// with the token that answers it; the token answers once however often it
// is posted; an unknown token is refused.
func TestApprovalTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan delivery, 1)
	handlers := awaitHandlers(0, nil, got)
	handlers["turn"] = func(ctx context.Context, run *machine.Run) error {
		if run.Task.Phase == "after" {
			return run.Complete(ctx, nil)
		}
		agent, err := run.Spawn(ctx, machine.SpawnParams{Kind: "agent"})
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{agent.ID}, Policy: arbortype.AllSettled, Phase: "after"})
	}
	handlers["agent"] = func(ctx context.Context, run *machine.Run) error {
		if run.Task.Phase == "after" {
			return run.Complete(ctx, nil)
		}
		a, err := run.Spawn(ctx, machine.SpawnParams{Kind: "approval"})
		if err != nil {
			return err
		}
		return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{a.ID}, Policy: arbortype.AllSettled, Phase: "after"})
	}
	fastRunner(t, b, handlers, nil)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	var pending []arbortype.PendingEvent
	waitUntil(t, "the approval to be pending", func() bool {
		pending, err = b.engine.PendingEvents(b.ctx, b.conv)
		require.NoError(t, err)
		return len(pending) == 1
	})
	require.Equal(t, "approve", pending[0].Name)
	require.Equal(t, "approval", pending[0].Kind)
	require.True(t, strings.HasPrefix(pending[0].Token, "awt_"))
	require.Nil(t, pending[0].Timeout)

	_, _, err = b.engine.EmitToken(b.ctx, "awt_forged", nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	for i := range 3 { // a double click, a retry
		_, created, err := b.engine.EmitToken(b.ctx, pending[0].Token, json.RawMessage(`{"approved": true}`))
		require.NoError(t, err)
		require.Equal(t, i == 0, created)
	}
	d := <-got
	require.JSONEq(t, `{"approved": true}`, string(d.delivered.Payload))
	waitUntil(t, "the turn to complete", func() bool { return b.status(t, turn.ID) == arbortype.StatusCompleted })
	pending, err = b.engine.PendingEvents(b.ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, pending)
	b.requireClean(t)
}

// When an awaiting task settles any other way (aborted, by a user's stop),
// nothing is left waiting: its timeout's job and timer are gone in that
// transaction, and it is no longer pending (inngest-js #1617: the losing
// wait of a race kept the run "running").
func TestAbortedAwaitLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fastRunner(t, b, awaitHandlers(time.Hour, nil, make(chan delivery, 1)), nil)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
	require.NoError(t, err)
	waitUntil(t, "the await to park", func() bool { return b.status(t, task.ID) == arbortype.StatusSleeping })
	_, err = b.engine.Abort(b.ctx, task.ID, tasks.WithReason("the user left"))
	require.NoError(t, err)
	got := b.get(t, task.ID)
	require.Equal(t, arbortype.StatusAborted, got.Status)
	require.NotNil(t, got.Error)
	require.Equal(t, arbortype.CodeAborted, got.Error.Code)
	require.Equal(t, "the user left", got.Error.Message)
	pending, err := b.engine.PendingEvents(b.ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, pending)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "approve"})
	require.ErrorIs(t, err, arbortype.ErrSettled, "an emit to a settled task")
	b.requireClean(t) // no wake job left for the sleep that is over
}

// Every new operation refuses bad input with a clear arbor error and
// writes nothing.
func TestEventsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
	require.NoError(t, err)
	other, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-other", Kind: "approval"})
	require.NoError(t, err)
	before := snapshot(t, b)
	big := json.RawMessage(`"` + strings.Repeat("x", 70<<10) + `"`)
	for name, tc := range map[string]struct {
		p    tasks.EmitParams
		want error
	}{
		"no name":          {tasks.EmitParams{ConversationID: b.conv}, arbortype.ErrInvalidArgument},
		"no conversation":  {tasks.EmitParams{Name: "x"}, arbortype.ErrInvalidArgument},
		"unknown conv":     {tasks.EmitParams{ConversationID: b.conv + "-nope", Name: "x"}, arbortype.ErrNotFound},
		"unknown task":     {tasks.EmitParams{ConversationID: b.conv, TaskID: 1 << 40, Name: "x"}, arbortype.ErrNotFound},
		"foreign task":     {tasks.EmitParams{ConversationID: b.conv, TaskID: other.ID, Name: "x"}, arbortype.ErrForeignTask},
		"negative task":    {tasks.EmitParams{ConversationID: b.conv, TaskID: -1, Name: "x"}, arbortype.ErrInvalidArgument},
		"payload too big":  {tasks.EmitParams{ConversationID: b.conv, Name: "x", Payload: big}, arbortype.ErrPayloadTooLarge},
		"malformed JSON":   {tasks.EmitParams{ConversationID: b.conv, Name: "x", Payload: json.RawMessage(`{`)}, arbortype.ErrInvalidJSON},
		"reserved key":     {tasks.EmitParams{ConversationID: b.conv, Name: "x", IdempotencyKey: "arbor:k"}, arbortype.ErrInvalidArgument},
		"name too long":    {tasks.EmitParams{ConversationID: b.conv, Name: strings.Repeat("n", 201)}, arbortype.ErrInvalidArgument},
		"task of the conv": {tasks.EmitParams{ConversationID: b.conv + "-other", TaskID: task.ID, Name: "x"}, arbortype.ErrForeignTask},
	} {
		_, _, err := b.engine.Emit(b.ctx, tc.p)
		require.ErrorIs(t, err, tc.want, name)
	}
	_, err = b.engine.PendingEvents(b.ctx, b.conv+"-nope")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, _, err = b.engine.EmitToken(b.ctx, "", nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.AwaitSettled(b.ctx, 1<<40)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	// The log of an unknown conversation is ErrNotFound too.
	_, err = b.engine.ReadLog(b.ctx, b.conv+"-nope", 0, 10)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = b.engine.LogHead(b.ctx, b.conv+"-nope")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	// Follow of a conversation that does not exist waits for it (a client
	// opens its stream before its first message): it ends with its context,
	// having created nothing; a malformed id is refused at once.
	followCtx, cancelFollow := context.WithCancel(b.ctx)
	followed := make(chan error, 1)
	go func() {
		followed <- b.engine.Follow(followCtx, b.conv+"-nope", 0, func(arbortype.LogEntry) error { return nil })
	}()
	cancelFollow()
	require.ErrorIs(t, <-followed, context.Canceled)
	_, err = b.engine.Conversation(b.ctx, b.conv+"-nope")
	require.ErrorIs(t, err, arbortype.ErrNotFound, "following created nothing")
	err = b.engine.Follow(b.ctx, "", 0, func(arbortype.LogEntry) error { return nil })
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	head, err := b.engine.LogHead(b.ctx, b.conv)
	require.NoError(t, err)
	entries, err := b.engine.ReadLog(b.ctx, b.conv, head, 10)
	require.NoError(t, err, "a known conversation's log read past its end is empty, not unknown")
	require.Empty(t, entries)
	_, err = b.engine.ReadLog(b.ctx, b.conv, -1, 10)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.ReadLog(b.ctx, b.conv, 0, 0)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = b.engine.Abort(b.ctx, task.ID, tasks.WithReason(strings.Repeat("r", 201)))
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	require.Equal(t, before, snapshot(t, b), "nothing written")
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
	_, err = b.engine.AbortConversation(b.ctx, b.conv+"-other")
	require.NoError(t, err)
}
