package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// An approval from the command line: pending lists the await with its
// token; emit --token answers it once; the task is woken with the payload;
// a forged token, a bad payload and an unknown conversation are refused
// plainly.
func TestEmitAnswersAnApproval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	run := b.start(t, 4) // ask_approval
	res, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
	require.NoError(t, err)
	require.False(t, res.Woken)
	token := res.Task.AwaitToken

	out := b.arbor(t, "pending", b.conv).ok(t).stdout
	require.Equal(t, fmt.Sprintf("#4 ask_approval awaits approval (no timeout): token %s\n", token), out)
	// The tree says what a person waits for: an await, not a sleep.
	tree := b.arbor(t, "tree", b.conv).ok(t).stdout
	require.Contains(t, tree, "#4 ask_approval [awaiting approval] phase=decided")
	require.NotContains(t, tree, "[sleeping]")
	// ls counts it apart from the sleeps.
	require.Contains(t, b.arbor(t, "ls", "--json").ok(t).stdout, `"awaiting": 1`)

	b.arbor(t, "emit", "--token", "awt_forged", `{"approved": true}`).fails(t, 1, "no await has the token awt_forged")
	b.arbor(t, "emit", "--token", token, `{"approved": `).fails(t, 1, "is not valid JSON")
	b.arbor(t, "emit", b.conv+"-nope", "approval").fails(t, 1, "conversation "+b.conv+"-nope not found")

	out = b.arbor(t, "emit", "--token", token, `{"approved": true}`).ok(t).stdout
	require.Contains(t, out, "delivered to #4, which runs again")
	out = b.arbor(t, "emit", "--token", token, `{"approved": true}`).ok(t).stdout
	require.Contains(t, out, "was emitted already: nothing new")
	got, err := b.engine.Get(b.ctx, 4)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got.Status)
	require.JSONEq(t, `{"approved": true}`, string(got.Delivered.Payload))
	require.Contains(t, b.arbor(t, "show", "4").ok(t).stdout, "delivered")
	require.Equal(t, fmt.Sprintf("conversation %s awaits nothing\n", b.conv), b.arbor(t, "pending", b.conv).ok(t).stdout)

	// The task awaits again: the first token still says it was emitted; a
	// token of an await that timed out, or was woken, is refused.
	run = b.start(t, 4)
	res, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Phase: "decided"})
	require.NoError(t, err)
	out = b.arbor(t, "emit", "--token", token, `{"approved": false}`).ok(t).stdout
	require.Contains(t, out, "was emitted already: nothing new")
	_, err = b.engine.WakeNow(b.ctx, 4)
	require.NoError(t, err)
	b.arbor(t, "emit", "--token", res.Task.AwaitToken, `{"approved": true}`).fails(t, 1,
		"the await of the token "+res.Task.AwaitToken+" is over (answered, timed out, or its task moved on): nothing was emitted")
	require.True(t, b.get(t, 4).Delivered.TimedOut, "woken without the refused answer")

	out = b.arbor(t, "emit", b.conv, "note", "hello", "--queue").ok(t).stdout
	require.Contains(t, out, "nothing awaits it yet")
	var payload struct {
		Payload string `json:"payload"`
	}
	log, err := b.engine.ReadLog(b.ctx, b.conv, 0, 1000)
	require.NoError(t, err)
	last := log[len(log)-1]
	require.Equal(t, arbortype.LogKindEvent, last.Kind)
	require.NoError(t, json.Unmarshal(last.Payload, &payload))
	require.Equal(t, "hello", payload.Payload, "a bare word is a JSON string")
}

// abort --reason records why; abort --conversation stops everything live;
// log prints every status change in order.
func TestAbortReasonAndConversationAndLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	out := b.arbor(t, "abort", "6", "--reason", "the user pressed stop").ok(t).stdout
	require.Contains(t, out, "#6 chat_turn: running → aborted")
	show := b.arbor(t, "show", "6").ok(t).stdout
	require.Contains(t, show, "aborted")
	require.Contains(t, show, "the user pressed stop")

	b.arbor(t, "abort").fails(t, 1, "give either a task id or --conversation")
	b.arbor(t, "abort", "1", "--conversation", b.conv).fails(t, 1, "give either a task id or --conversation")
	out = b.arbor(t, "abort", "--conversation", b.conv).ok(t).stdout
	require.True(t, strings.HasPrefix(out, "abort conversation "+b.conv+": settled "), out)
	all, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)
	for _, task := range all {
		require.True(t, task.Status.Settled(), "#%d is %s", task.ID, task.Status)
	}

	out = b.arbor(t, "log", b.conv).ok(t).stdout
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.GreaterOrEqual(t, len(lines), 8)
	require.Contains(t, lines[0], "#1 chat_turn pending")
	require.Contains(t, out, "#6 chat_turn aborted (aborted: the user pressed stop)\n", "the log says why")
	out = b.arbor(t, "log", b.conv, "--follow", "--until-settled", "1").ok(t).stdout
	require.Contains(t, out, "#1 chat_turn aborted", "following stops at the settle, already in the log")
	head := strings.Fields(lines[len(lines)-1])[0]
	out = b.arbor(t, "log", b.conv, "--follow", "--after", head, "--until-settled", "1").ok(t).stdout
	require.Empty(t, out, "a task settled before the entries followed: nothing to wait for (it once followed forever)")
}

// A failure's log line carries its message (code-less: a handler's error),
// with its control characters escaped, on one line.
func TestLogPrintsAFailuresMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := b.create(t, 0, "turn", false)
	run := b.start(t, task.ID)
	_, err := b.engine.Fail(b.ctx, run.ID, run.Token, arbortype.TaskError{Message: "tool said:\nno \x1b[31mred\x1b[0m"})
	require.NoError(t, err)
	out := b.arbor(t, "log", b.conv).ok(t).stdout
	require.Contains(t, out, fmt.Sprintf(`#%d turn failed (tool said:\nno \x1b[31mred\x1b[0m)`+"\n", task.ID))
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, "pending, running, failed: one line each")
}

// A settle entry of the log written by hand for a task still running does
// not end a follow --until-settled: only the task's own settle does
// (issue 24's audit saw the follow stop, exit 0, at the forged entry). The
// log's INSERT guard refuses such an entry (the schema baseline); the test
// writes it with the triggers off, as a superuser restoring a dump could.
func TestFollowUntilSettledIgnoresAForgedSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := b.create(t, 0, "turn", false)
	run := b.start(t, task.ID)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err, "the test forges with the triggers off (a superuser's session_replication_role)")
	_, err = tx.Exec(b.ctx, `INSERT INTO `+b.schema+`.conversation_log (conversation_id, task_id, kind, status, name) VALUES ($1, $2, 'status', 'completed', 'turn')`, b.conv, task.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	entries, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	forged := entries[len(entries)-1]
	require.True(t, forged.Terminal())

	engine := b.engine.Engine
	settled, err := settles(b.ctx, engine, task.ID, forged)
	require.NoError(t, err)
	require.False(t, settled, "the task is still running")
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
	entries, err = b.engine.ReadLog(b.ctx, b.conv, forged.Seq, 100)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	real := entries[len(entries)-1]
	settled, err = settles(b.ctx, engine, task.ID, real)
	require.NoError(t, err)
	require.True(t, settled, "the task's own settle")
	settled, err = settles(b.ctx, engine, task.ID+1000, real)
	require.NoError(t, err)
	require.False(t, settled, "another task's entry")
}
