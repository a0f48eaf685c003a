package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// events lists what was emitted to a conversation and what became of each
// event: delivered (to which task, when) or waiting; --json the same as
// rows.
func TestEventsListsWhatBecameOfEachEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	require.Equal(t, fmt.Sprintf("conversation %s has no events\n", b.conv), b.arbor(t, "events", b.conv).ok(t).stdout)

	_, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: turn.ID, Name: "message",
		Payload: json.RawMessage(`"also in French"`), Queue: true})
	require.NoError(t, err)
	res, err := b.engine.AwaitEvent(b.ctx, turn.ID, turn.Token, core.AwaitParams{Name: "message", Phase: "steered"})
	require.NoError(t, err)
	require.True(t, res.Woken, "the await took the message")
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approval", Payload: json.RawMessage(`{"ok": true}`)})
	require.NoError(t, err)

	lines := strings.Split(strings.TrimSuffix(b.arbor(t, "events", b.conv).ok(t).stdout, "\n"), "\n")
	require.Len(t, lines, 2)
	require.Regexp(t, `^#\d+ message to #1 \(queued\) \d{4}-\d\d-\d\dT[0-9:.]+Z: delivered to #1 at [0-9T:.Z-]+; "also in French"$`, lines[0])
	require.Regexp(t, `^#\d+ approval to the conversation \(first wins\) [0-9T:.Z-]+: waiting; \{"ok": true\}$`, lines[1])

	var out struct {
		Conversation string `json:"conversation"`
		Events       []struct {
			ID          int64           `json:"id"`
			TaskID      *int64          `json:"task_id"`
			Name        string          `json:"name"`
			Payload     json.RawMessage `json:"payload"`
			Queued      bool            `json:"queued"`
			DeliveredTo *int64          `json:"delivered_to"`
			DeliveredAt *string         `json:"delivered_at"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "events", b.conv, "--json").ok(t).stdout), &out))
	require.Equal(t, b.conv, out.Conversation)
	require.Len(t, out.Events, 2)
	msg, approval := out.Events[0], out.Events[1]
	require.Equal(t, "message", msg.Name)
	require.True(t, msg.Queued)
	require.Equal(t, turn.ID, *msg.TaskID)
	require.Equal(t, turn.ID, *msg.DeliveredTo)
	require.NotNil(t, msg.DeliveredAt)
	require.Nil(t, approval.TaskID, "addressed to the conversation")
	require.Nil(t, approval.DeliveredTo, "waiting")
	require.JSONEq(t, `{"ok": true}`, string(approval.Payload))

	after := b.arbor(t, "events", b.conv, "--after", fmt.Sprint(msg.ID)).ok(t).stdout
	require.Equal(t, lines[1]+"\n", after)
	b.arbor(t, "events", b.conv+"-nope").fails(t, 1, fmt.Sprintf("conversation %q not found", b.conv+"-nope"))
}
