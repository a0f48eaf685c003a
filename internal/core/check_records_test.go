package core_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// forgeryScene is a conversation with a row of each kind the checker
// reads beside the tasks, for a forgery to spoil.
type forgeryScene struct {
	b *bundle
	// turn runs under the test's lease; awaiting is parked in an await of
	// "approval"; woken was woken by the event answered; settled logged
	// progress and completed; pending never ran; foreign is a task of
	// another conversation.
	turn, awaiting, woken, settled, pending, foreign int64
	// answered was delivered to woken; note waits undelivered.
	answered, note int64
}

// newForgeryScene builds the scene on a conversation of its own, which
// the invariant checker finds clean; unlike setup's, its bundle does not
// require that at the test's end.
func newForgeryScene(t *testing.T) *forgeryScene {
	t.Helper()
	pool, schema := testdb.Shared(t)
	ctx := context.Background()
	b := &bundle{ctx: ctx, pool: pool, schema: schema, conv: testdb.Conversation(t),
		engine: enginetest.New(t, pool, &tasks.Config{Schema: schema})}
	s := &forgeryScene{b: b}
	turn, _, err := b.engine.Create(ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}})
	require.NoError(t, err)
	b.lease(t)
	s.turn = b.start(t, turn.ID).ID
	awaitOn := func(name string) int64 {
		run := b.start(t, b.child(t, s.turn, "approver").ID)
		_, err := b.engine.AwaitEvent(ctx, run.ID, run.Token, core.AwaitParams{Name: name})
		require.NoError(t, err)
		return run.ID
	}
	s.woken = awaitOn("ok")
	ev, _, err := b.engine.Emit(ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: s.woken, Name: "ok", Payload: []byte(`{"approved": false}`)})
	require.NoError(t, err)
	require.Equal(t, s.woken, ev.DeliveredTo)
	s.answered = ev.ID
	s.awaiting = awaitOn("approval")
	done := b.start(t, b.child(t, s.turn, "tool").ID)
	_, err = b.engine.C.Progress(ctx, b.pool, b.conv, done.ID, done.Token, "step", []byte(`{"done": 1}`))
	require.NoError(t, err)
	_, err = b.engine.Complete(ctx, done.ID, done.Token, nil)
	require.NoError(t, err)
	s.settled = done.ID
	s.pending = b.child(t, s.turn, "tool").ID
	ev, _, err = b.engine.Emit(ctx, tasks.EmitParams{ConversationID: b.conv, Name: "note"})
	require.NoError(t, err)
	s.note = ev.ID
	other, _, err := b.engine.Create(ctx, arbortype.CreateParams{ConversationID: b.conv + "-other", Kind: "turn"})
	require.NoError(t, err)
	s.foreign = other.ID
	vs, err := b.engine.Check(ctx, b.conv)
	require.NoError(t, err)
	require.Empty(t, vs, "the scene is clean")
	return s
}

// forge runs sql (with the scene's ids as named arguments) with the
// triggers off, as a superuser restoring a dump or a hand-written fix
// could, and commits it.
func (s *forgeryScene) forge(t *testing.T, sql string) {
	t.Helper()
	b := s.b
	args := pgx.NamedArgs{"conv": b.conv, "turn": s.turn, "awaiting": s.awaiting, "woken": s.woken, "settled": s.settled,
		"pending": s.pending, "foreign": s.foreign, "answered": s.answered, "note": s.note}
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err, "the test forges with the triggers off (a superuser's session_replication_role)")
	_, err = tx.Exec(b.ctx, strings.ReplaceAll(sql, "{schema}", b.schema), args)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
}

// TestCheckReportsForgedRecords (issue 24): each inconsistency a row
// written past the guards can leave — an event delivered to a task that
// never awaited it or to another conversation's, an approval no emit made,
// a log entry of another conversation's task, a status change the log
// does not have, a dangling holder, times in the future, a forged settle
// number or fork mark, a reservation of another conversation's task — is
// reported by the invariant checker, under its invariant.
func TestCheckReportsForgedRecords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, sql string
		invariant int
		want      string
	}{
		{"an event delivered to a task that never awaited it",
			`UPDATE {schema}.events SET delivered_to = @settled, delivered_at = now() WHERE id = @note`, 11, "never awaited"},
		{"an event delivered to a task of another conversation",
			`UPDATE {schema}.events SET delivered_to = @foreign, delivered_at = now() WHERE id = @note`, 11, "not a task of the conversation"},
		{"an event addressed to a task of another conversation",
			`UPDATE {schema}.events SET task_id = @foreign WHERE id = @note`, 11, "not a task of the conversation"},
		{"an event delivered to another task than its addressee",
			`UPDATE {schema}.events SET delivered_to = @awaiting WHERE id = @answered`, 11, "addressed to task"},
		{"an event delivered before it was emitted",
			`UPDATE {schema}.events SET emitted_at = delivered_at + interval '1 hour' WHERE id = @answered`, 11, "before it was emitted"},
		{"an event no emit made",
			`INSERT INTO {schema}.events (conversation_id, name, payload, queued) VALUES (@conv, 'approval', '{"approved": true}', true)`, 11, "not in the log"},
		{"an approval forged",
			`UPDATE {schema}.tasks SET status = 'pending', delivered = '{"name": "approval", "event_id": 424242, "payload": {"approved": true}}'
				WHERE id = @awaiting`, 11, "names no event delivered to it"},
		{"an approval's payload rewritten",
			`UPDATE {schema}.tasks SET delivered = jsonb_set(delivered, '{payload}', '{"approved": true}') WHERE id = @woken`, 11, "names no event delivered to it"},
		{"a parked await carrying a delivery",
			`UPDATE {schema}.tasks SET delivered = '{"name": "approval", "timed_out": true}' WHERE id = @awaiting`, 11, "carries a delivery"},
		{"a log entry naming a task of another conversation",
			`INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name) VALUES (@conv, @foreign, 'progress', 'step')`, 12, "not a task of the conversation"},
		{"a status change missing from the log",
			`UPDATE {schema}.tasks SET status = 'cancelled', settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq') WHERE id = @pending`, 12, "was not logged"},
		// A task with no entry at all is not looked at (retention, or a
		// row inserted outside arbor); one whose newest entry is gone is.
		{"a task's newest log entry deleted",
			`DELETE FROM {schema}.conversation_log WHERE seq = (SELECT max(seq) FROM {schema}.conversation_log WHERE task_id = @settled AND kind = 'status')`, 12, "was not logged"},
		{"a dangling holder row",
			`UPDATE {schema}.conversations SET holder_id = 424242424 WHERE id = @conv`, 8, "does not exist"},
		{"a holder renamed",
			`UPDATE {schema}.conversations SET holder = 'someone-else' WHERE id = @conv`, 8, "its holder row"},
		{"a holder without its row",
			`UPDATE {schema}.conversations SET holder_id = NULL WHERE id = @conv`, 8, "go together"},
		{"a holder's lease a year long",
			`UPDATE {schema}.holders SET expires_at = now() + interval '1 year' WHERE id = (SELECT holder_id FROM {schema}.conversations WHERE id = @conv)`, 8, "more than a day past"},
		{"a created_at in 2400",
			`UPDATE {schema}.tasks SET created_at = '2400-01-01' WHERE id = @pending`, 1, "after the database's clock"},
		{"a conversation born in 2400",
			`UPDATE {schema}.conversations SET created_at = '2400-01-01' WHERE id = @conv`, 1, "the conversation's created_at"},
		// The audit's forgeries: an answer to an await written straight
		// into the log, and an emit's entry with its payload rewritten.
		{"an event entry no emit wrote",
			`INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name, payload) VALUES (@conv, @awaiting, 'event', 'approval', '{"approved": true}')`, 12, "no emit wrote"},
		{"an emit's entry with its payload rewritten",
			`UPDATE {schema}.conversation_log SET payload = jsonb_set(payload, '{payload}', '{"approved": true}')
				WHERE seq = (SELECT min(seq) FROM {schema}.conversation_log WHERE conversation_id = @conv AND kind = 'event' AND (payload->>'event_id')::bigint = @answered)`, 12, "no emit wrote"},
		{"an event entry naming another conversation's event",
			`WITH ev AS (INSERT INTO {schema}.events (conversation_id, name, queued) VALUES (@conv::text || '-other', 'note', true) RETURNING id)
				INSERT INTO {schema}.conversation_log (conversation_id, kind, name, payload) SELECT @conv, 'event', 'note', jsonb_build_object('event_id', id) FROM ev`, 12, "no emit wrote"},
		{"an event entry naming an event id never given out",
			`INSERT INTO {schema}.conversation_log (conversation_id, kind, name, payload) VALUES (@conv, 'event', 'note', '{"event_id": 900000000000000000}')`, 12, "no emit wrote"},
		{"a log entry stamped in 2400",
			`INSERT INTO {schema}.conversation_log (conversation_id, kind, name, at) VALUES (@conv, 'progress', 'step', '2400-01-01')`, 12, "stamped after the database's clock"},
		{"a progress entry of a task that never ran",
			`INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name, payload) VALUES (@conv, @pending, 'progress', 'step', '{"done": 1}')`, 12, "progress no run wrote"},
		{"a progress entry of a settled task",
			`INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name) VALUES (@conv, @settled, 'progress', 'step')`, 12, "progress no run wrote"},
		{"a progress entry naming no task",
			`INSERT INTO {schema}.conversation_log (conversation_id, kind, name) VALUES (@conv, 'progress', 'step')`, 12, "progress no run wrote"},
		{"a settle number of -5",
			`UPDATE {schema}.tasks SET settle_seq = -5 WHERE id = @settled`, 1, "not positive"},
		{"a live task marked as a fork's copy",
			`UPDATE {schema}.tasks SET forked_from = @settled WHERE id = @pending`, 1, "fork's copy"},
		{"a reservation of a task of another conversation",
			`INSERT INTO {schema}.budget_reservations (conversation_id, task_id, counter, run_token, idempotency_key, amount)
				VALUES (@conv, @foreign, 'tokens', 1, 'forged', 0)`, 10, "not in the conversation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newForgeryScene(t)
			s.forge(t, c.sql)
			vs, err := s.b.engine.Check(s.b.ctx, s.b.conv)
			require.NoError(t, err)
			var found []string
			for _, v := range vs {
				found = append(found, v.String())
				if v.Invariant == c.invariant && strings.Contains(v.Message, c.want) {
					return
				}
			}
			require.Fail(t, fmt.Sprintf("no violation of invariant %d saying %q", c.invariant, c.want), "found: %q", found)
		})
	}
}

// TestCheckLetsAPrunedEventsEntryBe: an event entry whose event is gone
// (the prune deletes an event with the turn it was delivered to, and may
// keep its entry) names an id that was given out and belongs to no
// conversation now: the checker does not call it forged.
func TestCheckLetsAPrunedEventsEntryBe(t *testing.T) {
	t.Parallel()
	s := newForgeryScene(t)
	s.forge(t, `DELETE FROM {schema}.events WHERE id = @note`)
	vs, err := s.b.engine.Check(s.b.ctx, s.b.conv)
	require.NoError(t, err)
	for _, v := range vs {
		require.NotContains(t, v.Message, "no emit wrote", v.String())
	}
}

// TestCheckReportsRowsOfNoConversation (issue 24): rows written with the
// triggers off (and so with no foreign key checked) that name a
// conversation that does not exist are reported when the whole schema is
// checked, one violation per table and conversation.
func TestCheckReportsRowsOfNoConversation(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	ctx := context.Background()
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	conv := testdb.Conversation(t)
	_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	vs, err := eng.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, vs)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.tasks (conversation_id, kind) VALUES ('ghost', 'k')`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.events (conversation_id, name, queued) VALUES ('ghost', 'note', true)`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	vs, err = eng.Check(ctx)
	require.NoError(t, err)
	var got []string
	for _, v := range vs {
		if v.ConversationID == "ghost" {
			require.Equal(t, 7, v.Invariant, v.String())
			got = append(got, v.Message)
		}
	}
	require.ElementsMatch(t, []string{"1 rows of events name this conversation, which does not exist",
		"1 rows of tasks name this conversation, which does not exist"}, got)
	// A check of named conversations does not look for them.
	vs, err = eng.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
}
