package core_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// forgery is a statement written by hand that the database must refuse,
// with its SQLSTATE.
type forgery struct {
	name, sql string
	args      []any
	code      string
}

// requireRefused runs each forgery in a transaction of its own and
// checks that it is refused with its code (at its statement or at its
// commit) and that the conversations' rows and records are as they were.
func (b *bundle) requireRefused(t *testing.T, forged []forgery, convs ...string) {
	t.Helper()
	state := func() string {
		var s string
		for _, conv := range convs {
			c := *b
			c.conv = conv
			s += c.snapshot(t) + "|" + c.recordSnapshot(t) + "\n"
		}
		return s
	}
	before := state()
	for _, f := range forged {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, f.sql, f.args...)
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != f.code {
			// Each forgery is reported, not only the first.
			t.Errorf("%s: want SQLSTATE %s, got %v", f.name, f.code, err)
			before = state()
			continue
		}
		require.Equal(t, before, state(), f.name+": nothing written")
	}
}

// TestGuardRefusesReservationsNoBudgetExplains (issue 38, G1): a budget's
// sums agree with its scope's reservations at commit (the schema baseline), but
// the check ran only when a budget row changed: a reservation closed at 0,
// or inserted open with its run's token, the budgets left as they were,
// committed. A change of the reservations is checked too (the schema baseline),
// over every budget of the counter above the reserving task (its own, its
// owner's, the conversation's): each forgery fails at its commit with
// AB009 and leaves nothing. arbor's own reservations, records and spends,
// of the turn and of its child, pass.
func TestGuardRefusesReservationsNoBudgetExplains(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}, ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000}}})
	require.NoError(t, err)
	b.lease(t)
	run := b.start(t, turn.ID)
	child := b.child(t, run.ID, "search")
	childRun := b.start(t, child.ID)
	res, err := b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
		Counter: "tokens", Amount: 10, Key: "open"})
	require.NoError(t, err)
	open := res.Reservation.ID

	s := b.schema
	b.requireRefused(t, []forgery{
		{"a reservation closed at 0, the budgets untouched", `UPDATE ` + s + `.budget_reservations SET actual = 0, closed_at = now() WHERE id = $1`,
			[]any{open}, guardrules.SQLStateRecord},
		{"a reservation closed in full, the budgets untouched", `UPDATE ` + s + `.budget_reservations SET actual = amount, closed_at = now() WHERE id = $1`,
			[]any{open}, guardrules.SQLStateRecord},
		{"a reservation lapsed, the budgets untouched", `UPDATE ` + s + `.budget_reservations SET actual = amount, lapsed = true, closed_at = now() WHERE id = $1`,
			[]any{open}, guardrules.SQLStateRecord},
		{"a reservation inserted open with the run's token, the budgets untouched", `INSERT INTO ` + s + `.budget_reservations
			(conversation_id, task_id, counter, run_token, idempotency_key, amount) VALUES ($1, $2, 'tokens', $3, 'forged-1', 1)`,
			[]any{b.conv, run.ID, run.Token}, guardrules.SQLStateRecord},
		{"a spend inserted with the run's token, the budgets untouched", `INSERT INTO ` + s + `.budget_reservations
			(conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, closed_at) VALUES ($1, $2, 'tokens', $3, 'forged-2', 1, 1, now())`,
			[]any{b.conv, run.ID, run.Token}, guardrules.SQLStateRecord},
		// The child has no budget of its own: its owner's and the
		// conversation's are over it.
		{"a reservation of the child inserted, the budgets above it untouched", `INSERT INTO ` + s + `.budget_reservations
			(conversation_id, task_id, counter, run_token, idempotency_key, amount) VALUES ($1, $2, 'tokens', $3, 'forged-3', 1)`,
			[]any{b.conv, childRun.ID, childRun.Token}, guardrules.SQLStateRecord},
		// The conversation's budget raised with it, the turn's not.
		{"a reservation of the child with the conversation's budget alone", `WITH r AS (INSERT INTO ` + s + `.budget_reservations
			(conversation_id, task_id, counter, run_token, idempotency_key, amount) VALUES ($1, $2, 'tokens', $3, 'forged-4', 1))
			UPDATE ` + s + `.budgets SET reserved = reserved + 1 WHERE conversation_id = $1 AND task_id IS NULL`,
			[]any{b.conv, childRun.ID, childRun.Token}, guardrules.SQLStateRecord},
	}, b.conv)

	// Through the engine's transaction helper, the refusal at the commit is
	// an arbor error.
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (struct{}, error) {
		_, err := tx.Exec(b.ctx, `UPDATE `+s+`.budget_reservations SET actual = 0, closed_at = now() WHERE id = $1`, open)
		return struct{}{}, err
	})
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)

	// A forgery that moves every budget over the task as the reservation
	// does is arbor's own bookkeeping, and commits: the sums are what the
	// check holds, not who wrote them.
	_, err = b.pool.Exec(b.ctx, `WITH r AS (INSERT INTO `+s+`.budget_reservations
			(conversation_id, task_id, counter, run_token, idempotency_key, amount) VALUES ($1, $2, 'tokens', $3, 'by-hand', 1))
		UPDATE `+s+`.budgets SET reserved = reserved + 1 WHERE conversation_id = $1 AND counter = 'tokens'`, b.conv, childRun.ID, childRun.Token)
	require.NoError(t, err)

	// arbor's own: a spend and a reservation of the child, the open
	// reservation recorded, both runs completed.
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: childRun.ID, Token: childRun.Token,
		Counter: "tokens", Amount: 5, Key: "spent", Spend: true})
	require.NoError(t, err)
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: childRun.ID, Token: childRun.Token,
		Counter: "tokens", Amount: 7, Key: "child-open"})
	require.NoError(t, err)
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (store.ReservationRow, error) {
		return b.engine.C.RecordBudget(b.ctx, tx, b.conv, run.ID, open, 3)
	})
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, childRun.ID, childRun.Token, nil)
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
}

// forkedConversation makes a conversation whose settled turn awaited two
// events and was answered (one addressed to the conversation, one to the
// turn), forks it, and returns the turn, the fork and the turn's copy.
func forkedConversation(t *testing.T, b *bundle) (turn arbortype.Task, fork string, copied arbortype.Task) {
	t.Helper()
	turn = b.root(t, "turn")
	b.lease(t)
	run := b.start(t, turn.ID)
	_, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approval", Payload: js(`{"approved": false}`)})
	require.NoError(t, err)
	run = b.start(t, turn.ID)
	_, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "answer"})
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: turn.ID, Name: "answer", Payload: js(`"no"`)})
	require.NoError(t, err)
	run = b.start(t, turn.ID)
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, js(`"done"`))
	require.NoError(t, err)

	forked, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: turn.ID, NewConversationID: testdb.Conversation(t)})
	require.NoError(t, err)
	require.EqualValues(t, 2, forked.Events, "the fork copies both events: their copies are what a fork's copy is")
	copies, err := b.engine.ConversationTasks(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Len(t, copies, 1)
	t.Cleanup(func() {
		vs, err := b.engine.Check(b.ctx, forked.ConversationID)
		require.NoError(t, err)
		require.Empty(t, vs, "the fork's invariants")
	})
	return turn, forked.ConversationID, copies[0]
}

// TestGuardRefusesForgedForkEvents (issue 38, G3): in a forked
// conversation the rule of a fork's copy took any event that named a
// forked task: one backdated to 2000, already delivered to the fork's own
// live turn, with an approval no one gave; with the wake written by hand
// it approved that turn. A copy is now made only in the fork's own
// transaction, names forked tasks only, and is an event of their sources
// field for field (guardrules.RecordRules): each forgery is
// refused (AB009) and writes nothing, and the wake finds no event
// delivered to the turn. The fork's own copies went in (forkedConversation
// counts them), and the live turn is answered by an emit.
func TestGuardRefusesForgedForkEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, fork, copied := forkedConversation(t, b)
	live, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: fork, Kind: "turn"})
	require.NoError(t, err)
	_, err = b.engine.Lease(b.ctx, fork)
	require.NoError(t, err)
	run := b.start(t, live.ID)
	_, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	var source int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM `+b.schema+`.events WHERE conversation_id = $1 AND name = 'answer'`,
		b.conv).Scan(&source))

	s := b.schema
	insert := `INSERT INTO ` + s + `.events (conversation_id, task_id, name, payload, queued, emitted_at, delivered_to, delivered_at) VALUES `
	b.requireRefused(t, []forgery{
		{"the issue's: addressed to a copy, delivered to the live turn, backdated, approving", insert +
			`($1, $2, 'approval', '{"approved": true}', false, '2000-01-01', $3, now())`, []any{fork, copied.ID, live.ID}, guardrules.SQLStateRecord},
		{"addressed to the conversation, delivered to the live turn and to no copy", insert +
			`($1, NULL, 'approval', '{"approved": true}', false, '2000-01-01', $2, now())`, []any{fork, live.ID}, guardrules.SQLStateRecord},
		{"addressed to a copy, undelivered, a payload its source never had", insert +
			`($1, $2, 'approval', '{"approved": true}', false, '2000-01-01', NULL, NULL)`, []any{fork, copied.ID}, guardrules.SQLStateRecord},
		{"an exact copy of a source event, after the fork's transaction", `INSERT INTO ` + s + `.events
			(conversation_id, task_id, name, payload, idempotency_key, queued, emitted_at, delivered_to, delivered_at)
			SELECT $1, $2, e.name, e.payload, e.idempotency_key, e.queued, e.emitted_at, $2, e.delivered_at FROM ` + s + `.events e WHERE e.id = $3`,
			[]any{fork, copied.ID, source}, guardrules.SQLStateRecord},
	}, fork)

	// The wake that approved the live turn: no event was delivered to it.
	_, err = b.pool.Exec(b.ctx, `UPDATE `+s+`.tasks SET status = 'pending', updated_at = now(),
		delivered = jsonb_build_object('event_id', (SELECT max(id) FROM `+s+`.events WHERE conversation_id = $1), 'payload', '{"approved": true}'::jsonb)
		WHERE id = $2`, fork, live.ID)
	requireSQLState(t, err, guardrules.SQLStateColumn)
	require.Equal(t, arbortype.StatusSleeping, b.get(t, live.ID).Status)

	// An emit answers it.
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: fork, Name: "approval", Payload: js(`{"approved": true}`)})
	require.NoError(t, err)
	woken := b.get(t, live.ID)
	require.Equal(t, arbortype.StatusPending, woken.Status)
	again := b.start(t, live.ID)
	_, err = b.engine.Complete(b.ctx, again.ID, again.Token, nil)
	require.NoError(t, err)
}

// TestGuardRefusesLogEntriesArborNeverWrites (issue 38, G2): the log's
// INSERT check (the schema baseline) took entries arbor never writes, although
// guarantees.md says they are refused: an event entry stamped before its
// conversation existed, a second `completed` for a task settled long ago,
// `failed` and progress entries for a fork's copies, a status entry with
// no task and no status. Each is refused (AB009) and writes nothing
// (the schema baseline); arbor's own entries go on: a fork's copies of the log,
// a progress entry of a run, the status entries of a run and of an emit's
// wake.
func TestGuardRefusesLogEntriesArborNeverWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, fork, copied := forkedConversation(t, b)
	var eventID int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM `+b.schema+`.events WHERE conversation_id = $1 AND name = 'approval'`,
		b.conv).Scan(&eventID))

	s := b.schema
	log := `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, status, name, payload, at) VALUES `
	b.requireRefused(t, []forgery{
		{"an event entry stamped before its conversation existed", log +
			`($1, NULL, 'event', NULL, 'approval', jsonb_build_object('event_id', $2::bigint, 'payload', '{"approved": true}'::jsonb), '2000-01-01')`,
			[]any{b.conv, eventID}, guardrules.SQLStateRecord},
		{"an event entry naming no event, stamped before its conversation existed", log +
			`($1, NULL, 'event', NULL, 'approval', '{"event_id": 424242424, "payload": {"approved": true}}', '2000-01-01')`,
			[]any{b.conv}, guardrules.SQLStateRecord},
		{"a second completed for a task settled long ago", log + `($1, $2, 'status', 'completed', 'turn', NULL, DEFAULT)`,
			[]any{b.conv, turn.ID}, guardrules.SQLStateRecord},
		{"a status entry with no task and no status", log + `($1, NULL, 'status', NULL, NULL, NULL, DEFAULT)`,
			[]any{b.conv}, guardrules.SQLStateRecord},
		{"a status entry of a task with no status", log + `($1, $2, 'status', NULL, 'turn', NULL, DEFAULT)`,
			[]any{b.conv, turn.ID}, guardrules.SQLStateRecord},
		{"a failed entry for a fork's copy", log + `($1, $2, 'status', 'failed', 'turn', '{"error": "forged"}', DEFAULT)`,
			[]any{fork, copied.ID}, guardrules.SQLStateRecord},
		{"a completed entry for a fork's copy, stamped as its source's", log + `($1, $2, 'status', 'completed', 'turn', NULL, $3)`,
			[]any{fork, copied.ID, copied.SettledAt}, guardrules.SQLStateRecord},
		{"a progress entry for a fork's copy", log + `($1, $2, 'progress', NULL, 'step', '{"forged": true}', DEFAULT)`,
			[]any{fork, copied.ID}, guardrules.SQLStateRecord},
		{"an event entry of the fork stamped before it existed", log +
			`($1, NULL, 'event', NULL, 'approval', '{"event_id": null}', '2000-01-01')`,
			[]any{fork}, guardrules.SQLStateRecord},
	}, b.conv, fork)

	// arbor's own entries: a run's progress and statuses, an emit's wake,
	// in the conversation and in the fork.
	for _, conv := range []string{b.conv, fork} {
		next, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		require.NoError(t, err)
		_, err = b.engine.Lease(b.ctx, conv)
		require.NoError(t, err)
		run := b.start(t, next.ID)
		_, err = core.Read(b.ctx, b.engine.C, func(db store.DB) (int64, error) {
			return b.engine.C.Progress(b.ctx, db, conv, run.ID, run.Token, "step", js(`{"n": 1}`))
		})
		require.NoError(t, err)
		_, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "go"})
		require.NoError(t, err)
		_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: conv, Name: "go"})
		require.NoError(t, err)
		run = b.start(t, next.ID)
		_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
		require.NoError(t, err)
	}
}

// TestAnEmitWrittenByHandIsAnEmit (issue 38, G4) pins what the guards say
// of approvals, as internal/guardrules/columns.go and docs/guarantees.md now state it: a
// wake's delivery must be an event of the conversation, emitted (inserted
// undelivered, stamped now), delivered to that very task while it awaited
// the event's name, with the payload it was emitted with. Which program
// wrote those rows the database cannot tell: an approval written by hand
// exactly as Emit writes it — the event, its log entry, its delivery and
// the wake, in one transaction — is an emit, and commits, as
// Engine.Emit would for the same role. Every approval no emit made is
// refused and writes nothing.
func TestAnEmitWrittenByHandIsAnEmit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn := b.root(t, "turn")
	other := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, turn.ID)
	_, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	note, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "note", Payload: js(`{"approved": true}`)})
	require.NoError(t, err)
	elsewhere, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: other.ID, Name: "approval", Payload: js(`{"approved": true}`)})
	require.NoError(t, err)
	require.Zero(t, elsewhere.DeliveredTo)

	s := b.schema
	wake := `UPDATE ` + s + `.tasks SET status = 'pending', updated_at = now(), delivered = $2 WHERE id = $1`
	delivered := func(id int64, payload string) json.RawMessage {
		return js(`{"event_id": ` + jsonInt(id) + `, "payload": ` + payload + `}`)
	}
	b.requireRefused(t, []forgery{
		{"a wake naming no event", wake, []any{turn.ID, delivered(424242424, `{"approved": true}`)}, guardrules.SQLStateColumn},
		{"a wake naming an event not delivered to it", wake, []any{turn.ID, delivered(note.ID, `{"approved": true}`)}, guardrules.SQLStateColumn},
		{"a wake whose payload is not the event's", wake, []any{turn.ID, delivered(note.ID, `{"approved": false}`)}, guardrules.SQLStateColumn},
		{"an event of another name delivered to it", `UPDATE ` + s + `.events SET delivered_to = $2, delivered_at = now() WHERE id = $1`,
			[]any{note.ID, turn.ID}, guardrules.SQLStateRecord},
		{"an event addressed to another task delivered to it", `UPDATE ` + s + `.events SET delivered_to = $2, delivered_at = now() WHERE id = $1`,
			[]any{elsewhere.ID, turn.ID}, guardrules.SQLStateRecord},
		{"an event inserted delivered", `INSERT INTO ` + s + `.events (conversation_id, name, payload, queued, delivered_to, delivered_at)
			VALUES ($1, 'approval', '{"approved": true}', false, $2, now())`, []any{b.conv, turn.ID}, guardrules.SQLStateRecord},
	}, b.conv)

	// Exactly as Emit writes it: an emit.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(b.ctx, `INSERT INTO `+s+`.events (conversation_id, name, payload, queued)
			VALUES ($1, 'approval', '{"approved": true}', false) RETURNING id`, b.conv).Scan(&id); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.conversation_log (conversation_id, kind, name, payload)
			VALUES ($1, 'event', 'approval', jsonb_build_object('event_id', $2::bigint, 'payload', '{"approved": true}'::jsonb))`, b.conv, id); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `UPDATE `+s+`.events SET delivered_to = $2, delivered_at = greatest(now(), emitted_at) WHERE id = $1`, id, turn.ID); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `WITH w AS (UPDATE `+s+`.tasks SET status = 'pending', updated_at = now(), wake_at = NULL, wake_job_id = NULL,
				delivered = $2 WHERE id = $1 RETURNING *)
			INSERT INTO `+s+`.conversation_log (conversation_id, task_id, kind, status, name, payload)
			SELECT w.conversation_id, w.id, 'status', w.status, w.kind, NULL FROM w`,
			turn.ID, delivered(id, `{"approved": true}`))
		return err
	})
	require.NoError(t, err, "an emit written by hand is an emit")
	woken := b.get(t, turn.ID)
	require.Equal(t, arbortype.StatusPending, woken.Status)
	again := b.start(t, turn.ID)
	_, err = b.engine.Complete(b.ctx, again.ID, again.Token, nil)
	require.NoError(t, err)
}

func jsonInt(v int64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestGuardRefusesForgedReruns (issue 41): a row is inserted with a
// checkpoint only as a rerun of a failed, aborted or cancelled task of the
// same conversation, owner, kind, input and checkpoint; a task is rerun at
// most once; a waiting task's wait changes only by a waited task's rerun
// taking that task's place. Engine.Rerun's own writes pass.
func TestGuardRefusesForgedReruns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn := b.root(t, "turn")
	run := b.start(t, turn.ID)
	failed := b.child(t, turn.ID, "tool")
	done := b.child(t, turn.ID, "tool")
	other := b.child(t, turn.ID, "tool")
	_, err := b.engine.WaitForChildren(b.ctx, turn.ID, run.Token, core.WaitParams{ChildIDs: []int64{failed.ID, done.ID, other.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	fr := b.start(t, failed.ID)
	_, err = b.engine.Checkpoint(b.ctx, failed.ID, fr.Token, "p", json.RawMessage(`{"s":1}`))
	require.NoError(t, err)
	_, err = b.engine.Fail(b.ctx, failed.ID, fr.Token, arbortype.TaskError{Code: "x"})
	require.NoError(t, err)
	dr := b.start(t, done.ID)
	_, err = b.engine.Complete(b.ctx, done.ID, dr.Token, nil)
	require.NoError(t, err)

	s := b.schema
	ins := func(rerunOf any, kind, phase, state string) string {
		return `INSERT INTO ` + s + `.tasks (conversation_id, owner_task_id, kind, phase, state, tenant, queue_at, rerun_of)
			VALUES ('` + b.conv + `', ` + itoa(turn.ID) + `, '` + kind + `', '` + phase + `', ` + state + `, '', now(), ` + toSQL(rerunOf) + `)`
	}
	b.requireRefused(t, []forgery{
		{"a checkpoint on a fresh task", ins(nil, "tool", "p", `'{"s":1}'`), nil, guardrules.SQLStateInvalidInsert},
		{"a rerun of a completed task", ins(done.ID, "tool", "", "NULL"), nil, guardrules.SQLStateInvalidInsert},
		{"a rerun of a live task", ins(other.ID, "tool", "", "NULL"), nil, guardrules.SQLStateInvalidInsert},
		{"a rerun of another kind", ins(failed.ID, "search", "p", `'{"s":1}'`), nil, guardrules.SQLStateInvalidInsert},
		{"a rerun from another checkpoint", ins(failed.ID, "tool", "q", `'{"s":1}'`), nil, guardrules.SQLStateInvalidInsert},
		{"a rerun under another owner", `INSERT INTO ` + s + `.tasks (conversation_id, owner_task_id, kind, phase, state, tenant, queue_at, rerun_of)
			VALUES ('` + b.conv + `', NULL, 'tool', 'p', '{"s":1}', '', now(), ` + itoa(failed.ID) + `)`, nil, guardrules.SQLStateInvalidInsert},
		{"a waiting task's wait rewritten", `UPDATE ` + s + `.tasks SET wait_ids = ARRAY[` + itoa(other.ID) + `]::bigint[] WHERE id = $1`, []any{turn.ID}, guardrules.SQLStateColumn},
		{"a completed waited task swapped for a live one", `UPDATE ` + s + `.tasks SET wait_ids = array_replace(wait_ids, ` + itoa(done.ID) + `, ` + itoa(other.ID) + `) WHERE id = $1`, []any{turn.ID}, guardrules.SQLStateColumn},
	}, b.conv)

	rerun, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (arbortype.Task, error) { return b.engine.C.Rerun(b.ctx, tx, failed.ID) })
	require.NoError(t, err)
	require.Equal(t, []int64{rerun.ID, done.ID, other.ID}, b.get(t, turn.ID).WaitIDs)
	b.requireRefused(t, []forgery{
		{"a second rerun of the same task", ins(failed.ID, "tool", "p", `'{"s":1}'`), nil, "23505"},
	}, b.conv)
	b.requireInvariants(t)
}

func toSQL(v any) string {
	if v == nil {
		return "NULL"
	}
	return fmt.Sprint(v)
}

// TestGuardRefusesForgedStarts (issue 42; docs/design.md §3.18): a task
// inserted running is a root started by its create — the first task of a
// conversation a live holder took at the run's epoch, with a token, a live
// task lease, started now, and no concurrency limit that could count it —
// and a conversation is inserted free at epoch 0 or taken by a live holder
// under its own name at epoch 1. Every other form is refused, and the real
// create's start is accepted and passes the checker.
func TestGuardRefusesForgedStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type life struct {
		id   int64
		name string
	}
	newLife := func(name string, ttl time.Duration) life {
		id, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (int64, error) {
			id, _, err := b.engine.C.NewHolder(b.ctx, db, name, ttl)
			return id, err
		})
		require.NoError(t, err)
		return life{id, name}
	}
	live := newLife("live-"+b.conv, time.Hour)
	expired := newLife("expired-"+b.conv, time.Millisecond)
	require.Eventually(t, func() bool { // its millisecond over, by the database's clock
		var ok bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at < now() FROM `+b.schema+`.holders WHERE id = $1`, expired.id).Scan(&ok))
		return ok
	}, time.Minute, 5*time.Millisecond)
	require.NoError(t, b.engine.SetConcurrencyLimit(b.ctx, "kind:limited-"+b.conv, 5))

	s := b.schema
	n := 0
	conv := func() string { n++; return fmt.Sprintf("%s-f%d", b.conv, n) }
	// held inserts a conversation taken by holder h (named name) at epoch,
	// and then the task given (its columns after the conversation's id).
	held := func(h life, name string, epoch int, task string) string {
		c := conv()
		sql := `WITH c AS (INSERT INTO ` + s + `.conversations (id, holder_id, holder, epoch) VALUES ('` + c + `', ` + itoa(h.id) + `, '` + name + `', ` + itoa(int64(epoch)) + `) RETURNING id)`
		if task == "" {
			return sql + ` SELECT 1 FROM c`
		}
		return sql + ` INSERT INTO ` + s + `.tasks (conversation_id, owner_task_id, kind, tenant, queue_at, concurrency_key, status, token, run_epoch, started_at, lease_expires_at)
			SELECT c.id, ` + task + ` FROM c`
	}
	running := `NULL, 'turn', '', now(), NULL, 'running', 1, 1, now(), now() + interval '1 minute'`
	free := conv()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO `+s+`.conversations (id) VALUES ($1)`, free)
	require.NoError(t, err)
	withTask := conv()
	_, err = b.pool.Exec(b.ctx, `WITH c AS (INSERT INTO `+s+`.conversations (id, holder_id, holder, epoch) VALUES ($1, $2, $3, 1) RETURNING id)
		INSERT INTO `+s+`.tasks (conversation_id, kind, tenant, queue_at) SELECT c.id, 'turn', '', now() FROM c`, withTask, live.id, live.name)
	require.NoError(t, err, "a conversation taken by a live holder, with a pending task")

	b.requireRefused(t, []forgery{
		{"a conversation inserted at epoch 1 with no holder", `INSERT INTO ` + s + `.conversations (id, epoch) VALUES ('` + conv() + `', 1)`, nil, guardrules.SQLStateConversation},
		{"a conversation inserted held at epoch 0", held(live, live.name, 0, ""), nil, guardrules.SQLStateConversation},
		{"a conversation inserted held at epoch 2", held(live, live.name, 2, ""), nil, guardrules.SQLStateConversation},
		{"a conversation inserted held by an expired holder", held(expired, expired.name, 1, ""), nil, guardrules.SQLStateConversation},
		{"a conversation inserted held under another name", held(live, "someone", 1, ""), nil, guardrules.SQLStateConversation},
		{"a task inserted running in a free conversation", `INSERT INTO ` + s + `.tasks (conversation_id, owner_task_id, kind, tenant, queue_at, concurrency_key, status, token, run_epoch, started_at, lease_expires_at)
			VALUES ('` + free + `', ` + running + `)`, nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running beside another task", `INSERT INTO ` + s + `.tasks (conversation_id, owner_task_id, kind, tenant, queue_at, concurrency_key, status, token, run_epoch, started_at, lease_expires_at)
			VALUES ('` + withTask + `', ` + running + `)`, nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running at another epoch", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'running', 1, 2, now(), now() + interval '1 minute'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running with no token", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'running', NULL, 1, now(), now() + interval '1 minute'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running with a lease over", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'running', 1, 1, now(), now() - interval '1 second'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running, started before", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'running', 1, 1, now() - interval '1 second', now() + interval '1 minute'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running with a concurrency key", held(live, live.name, 1, `NULL, 'turn', '', now(), 'k', 'running', 1, 1, now(), now() + interval '1 minute'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted running under a limit of its kind", held(live, live.name, 1, `NULL, 'limited-`+b.conv+`', '', now(), NULL, 'running', 1, 1, now(), now() + interval '1 minute'`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted pending with a token", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'pending', 1, NULL, NULL, NULL`), nil, guardrules.SQLStateInvalidInsert},
		{"a task inserted waiting", held(live, live.name, 1, `NULL, 'turn', '', now(), NULL, 'waiting', NULL, NULL, NULL, NULL`), nil, guardrules.SQLStateInvalidInsert},
	}, free, withTask)

	// The create's own start, under the live holder: accepted, and the
	// log's one status entry of the task is its start.
	started := conv()
	p := core.CreateParams{CreateParams: arbortype.CreateParams{ConversationID: started, Kind: "turn"}}
	task, ok, err := core.CreateRoot(b.ctx, b.engine.C, p)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, arbortype.StatusPending, task.Status, "no starter registered: pending")
	g := &testGrant{holder: live.id}
	b.engine.C.AddStarter(testStarter{g})
	defer b.engine.C.RemoveStarter(testStarter{g})
	p.ConversationID = started + "-2"
	task, ok, err = core.CreateRoot(b.ctx, b.engine.C, p)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, arbortype.StatusRunning, task.Status)
	require.EqualValues(t, 1, task.Epoch)
	require.NotZero(t, task.Token)
	require.Equal(t, []arbortype.Task{task}, g.done, "the grant was told of the run")
	entries, err := b.engine.ReadLog(b.ctx, p.ConversationID, 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, arbortype.StatusRunning, entries[0].Status)
	c := *b
	c.conv = p.ConversationID
	c.requireInvariants(t)
}

type testStarter struct{ g *testGrant }

func (s testStarter) Runs(string) bool               { return true }
func (s testStarter) Grant(int) core.StartGrant      { return s.g }
func (s testStarter) GrantIn(string) core.ClaimGrant { return nil }

type testGrant struct {
	holder int64
	done   []arbortype.Task
}

func (g *testGrant) Holder() int64                     { return g.holder }
func (g *testGrant) N() int                            { return 1 }
func (g *testGrant) Done(ts []arbortype.Task, _ error) { g.done = ts }
