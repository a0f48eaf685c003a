package tasks_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// steerTurn is a turn that answers its input, or, in phase "listening",
// awaits a steered message and answers with it.
func steerTurn(listen bool) machine.Handler {
	return func(ctx context.Context, run *machine.Run) error {
		if d := run.Task.Delivered; d != nil && d.Name == tasks.SteerEventDefault {
			return run.Complete(ctx, json.RawMessage(`{"steered": `+string(d.Payload)+`}`))
		}
		if listen {
			return run.AwaitEvent(ctx, machine.AwaitParams{Name: tasks.SteerEventDefault, Phase: "listening"})
		}
		return run.Complete(ctx, json.RawMessage(`{"answered": `+string(run.Task.Input)+`}`))
	}
}

type steerBundle struct {
	ctx    context.Context
	engine *tasks.Engine
	conv   string
}

func setupSteer(t *testing.T) *steerBundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	engine, err := tasks.New(t.Context(), pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	return &steerBundle{ctx: t.Context(), engine: engine, conv: testdb.Conversation(t)}
}

// steer sends msg to the conversation with the steer policy and requires
// that it went to the live turn.
func (b *steerBundle) steer(t *testing.T, live arbortype.Task, msg, key string) {
	t.Helper()
	got, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		OnBusy: arbortype.TurnSteer, Input: json.RawMessage(msg), IdempotencyKey: key})
	require.NoError(t, err)
	require.False(t, created, "steered into the live turn")
	require.Equal(t, live.ID, got.ID)
}

// ownTurn returns the steered message's own turn: the conversation's
// newest root.
func (b *steerBundle) ownTurn(t *testing.T) arbortype.Task {
	t.Helper()
	all, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)
	return all[len(all)-1]
}

// A message steered into a turn that settles without awaiting it is not
// lost: it is a turn of its own, queued behind the live one, which answers
// it; the event stays undelivered, addressed to the turn that ignored it.
func TestSteeredMessageNotTakenIsATurnOfItsOwn(t *testing.T) {
	t.Parallel()
	b := setupSteer(t)
	live, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Input: json.RawMessage(`"first"`)})
	require.NoError(t, err)
	b.steer(t, live, `"also in French"`, "msg-2")
	b.steer(t, live, `"also in French"`, "msg-2") // the client's retry: one message
	own := b.ownTurn(t)
	require.NotEqual(t, live.ID, own.ID)
	require.Equal(t, arbortype.StatusPending, own.Status, "queued behind the live turn")
	require.JSONEq(t, `"also in French"`, string(own.Input))
	require.Equal(t, "msg-2", own.IdempotencyKey)

	res := arbortest.Work(b.ctx, t, b.engine, steerTurn(false), live.ID)
	require.Equal(t, arbortest.WorkCompleted, res.Outcome, "the live turn answers its own message only")
	res = arbortest.Work(b.ctx, t, b.engine, steerTurn(false), own.ID)
	require.Equal(t, arbortest.WorkCompleted, res.Outcome)
	arbortest.RequireSettled(b.ctx, t, b.engine, own.ID, arbortype.StatusCompleted, json.RawMessage(`{"answered": "also in French"}`))

	evs, err := b.engine.Events(b.ctx, b.conv, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1, "the retry made no second message")
	require.Equal(t, live.ID, evs[0].TaskID)
	require.Zero(t, evs[0].DeliveredTo, "the live turn never took it")
	arbortest.RequireConsistent(b.ctx, t, b.engine, b.conv)
}

// A message steered into a turn that awaits it (now, or at a later await)
// is that turn's: its own turn is cancelled in the transaction that
// delivers it, code "steered", naming the turn that took it, and never
// runs.
func TestSteeredMessageTakenCancelsItsOwnTurn(t *testing.T) {
	t.Parallel()
	for _, parkedFirst := range []bool{true, false} {
		name := "sent while the turn runs"
		if parkedFirst {
			name = "sent while the turn awaits"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupSteer(t)
			live, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
			require.NoError(t, err)
			if parkedFirst {
				res := arbortest.Work(b.ctx, t, b.engine, steerTurn(true), live.ID)
				require.Equal(t, arbortest.WorkAwaiting, res.Outcome)
				require.False(t, res.Woken)
				b.steer(t, live, `"stop and summarize"`, "")
			} else {
				b.steer(t, live, `"stop and summarize"`, "")
				res := arbortest.Work(b.ctx, t, b.engine, steerTurn(true), live.ID)
				require.Equal(t, arbortest.WorkAwaiting, res.Outcome)
				require.True(t, res.Woken, "the await took the message waiting for it")
			}
			own := arbortest.RequireSettled(b.ctx, t, b.engine, b.ownTurn(t).ID, arbortype.StatusCancelled, nil)
			require.Equal(t, arbortype.CodeSteered, own.Error.Code)
			require.Contains(t, own.Error.Message, "taken by task")
			require.Nil(t, own.StartedAt, "it never ran")
			var taken struct {
				TakenBy int64 `json:"taken_by"`
				Event   int64 `json:"event"`
			}
			require.NoError(t, json.Unmarshal(own.Result, &taken))
			require.Equal(t, live.ID, taken.TakenBy)
			evs, err := b.engine.Events(b.ctx, b.conv, 0, 10)
			require.NoError(t, err)
			require.Len(t, evs, 1)
			require.Equal(t, evs[0].ID, taken.Event)
			require.Equal(t, live.ID, evs[0].DeliveredTo)

			res := arbortest.Work(b.ctx, t, b.engine, steerTurn(true), live.ID)
			require.Equal(t, arbortest.WorkCompleted, res.Outcome)
			arbortest.RequireSettled(b.ctx, t, b.engine, live.ID, arbortype.StatusCompleted, json.RawMessage(`{"steered": "stop and summarize"}`))
			arbortest.RequireConsistent(b.ctx, t, b.engine, b.conv)
		})
	}
}

// Retention keeps the turn that answered: a steered message's turn,
// cancelled because the answer took its message, is newer, and is kept
// beside it rather than instead of it while the conversation is in use.
func TestPruneKeepsTheTurnThatTookASteeredMessage(t *testing.T) {
	t.Parallel()
	b := setupSteer(t)
	old, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	arbortest.Work(b.ctx, t, b.engine, steerTurn(false), old.ID)
	live, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	arbortest.Work(b.ctx, t, b.engine, steerTurn(true), live.ID)
	b.steer(t, live, `"more"`, "")
	own := b.ownTurn(t)
	arbortest.Work(b.ctx, t, b.engine, steerTurn(true), live.ID)
	arbortest.RequireSettled(b.ctx, t, b.engine, live.ID, arbortype.StatusCompleted, nil)
	next, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"}) // in use
	require.NoError(t, err)

	res, err := b.engine.Prune(b.ctx, tasks.PruneParams{OlderThan: time.Nanosecond})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Turns, "only the oldest turn goes")
	for _, id := range []int64{live.ID, own.ID, next.ID} {
		_, err := b.engine.Get(b.ctx, id)
		require.NoError(t, err, "task %d is kept", id)
	}
	_, err = b.engine.Abort(b.ctx, next.ID)
	require.NoError(t, err)
}
