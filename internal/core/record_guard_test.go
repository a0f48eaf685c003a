package core_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/tasks"
)

// recordSnapshot returns every event, log entry, budget and reservation of
// the conversation as JSON text: two equal snapshots mean none was written.
func (b *bundle) recordSnapshot(t *testing.T) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `SELECT concat_ws('|',
		(SELECT json_agg(e ORDER BY id)::text FROM `+b.schema+`.events e WHERE conversation_id = $1),
		(SELECT json_agg(l ORDER BY seq)::text FROM `+b.schema+`.conversation_log l WHERE conversation_id = $1),
		(SELECT json_agg(g ORDER BY counter, task_id)::text FROM `+b.schema+`.budgets g WHERE conversation_id = $1),
		(SELECT json_agg(r ORDER BY id)::text FROM `+b.schema+`.budget_reservations r WHERE conversation_id = $1))`, b.conv).Scan(&s)
	require.NoError(t, err)
	return s
}

// TestGuardRefusesForgedRecords (issue 24): events, the log, budgets and
// reservations change only as arbor changes them. Each forgery written by
// hand is refused by the database with AB009 (a forged row or change) or
// AB006 (a delete off the prune path, a TRUNCATE), and writes nothing; the
// engine reports the code as ErrInvalidTransition.
func TestGuardRefusesForgedRecords(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}})
	require.NoError(t, err)
	b.lease(t)
	run := b.start(t, turn.ID)
	res, err := b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
		Counter: "tokens", Amount: 10, Key: "open"})
	require.NoError(t, err)
	open := res.Reservation.ID
	res, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
		Counter: "tokens", Amount: 5, Key: "spent", Spend: true})
	require.NoError(t, err)
	closed := res.Reservation.ID
	_, err = b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	delivered, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "approval", Payload: json.RawMessage(`{"approved": false}`)})
	require.NoError(t, err)
	undelivered, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "note"})
	require.NoError(t, err)
	require.NotZero(t, delivered.DeliveredTo)
	require.Zero(t, undelivered.DeliveredTo)
	foreign, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-other", Kind: "turn"})
	require.NoError(t, err)
	woken, err := b.engine.Get(b.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, woken.Status, "the turn was woken by the approval: each forged entry below is refused for what it names")

	s := b.schema
	var seq int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT max(seq) FROM `+s+`.conversation_log WHERE conversation_id = $1`, b.conv).Scan(&seq))
	before, records := b.snapshot(t), b.recordSnapshot(t)

	forged := []struct {
		name, sql string
		args      []any
		code      string
	}{
		{"a log entry rewritten", `UPDATE ` + s + `.conversation_log SET payload = '{"forged": true}' WHERE seq = $1`, []any{seq}, guardrules.SQLStateRecord},
		{"a log entry deleted", `DELETE FROM ` + s + `.conversation_log WHERE seq = $1`, []any{seq}, guardrules.SQLStateDelete},
		{"the log truncated", `TRUNCATE ` + s + `.conversation_log`, nil, guardrules.SQLStateDelete},
		// The log's inserts (the schema baseline): an entry is what the tasks and
		// events are, appended by the statement that changes them.
		{"a status entry the task does not have", `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, status, name)
			VALUES ($1, $2, 'status', 'completed', 'turn')`, []any{b.conv, run.ID}, guardrules.SQLStateRecord},
		{"a progress entry of a task not running", `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, name)
			VALUES ($1, $2, 'progress', 'step')`, []any{b.conv, run.ID}, guardrules.SQLStateRecord},
		{"a progress entry naming no task", `INSERT INTO ` + s + `.conversation_log (conversation_id, kind, name)
			VALUES ($1, 'progress', 'step')`, []any{b.conv}, guardrules.SQLStateRecord},
		{"an event entry naming no event", `INSERT INTO ` + s + `.conversation_log (conversation_id, kind, name, payload)
			VALUES ($1, 'event', 'approval', '{"event_id": 424242424, "payload": {"approved": true}}')`, []any{b.conv}, guardrules.SQLStateRecord},
		{"an event entry without an event id", `INSERT INTO ` + s + `.conversation_log (conversation_id, kind, name, payload)
			VALUES ($1, 'event', 'approval', '{"payload": {"approved": true}}')`, []any{b.conv}, guardrules.SQLStateRecord},
		{"an event entry naming an event of another name", `INSERT INTO ` + s + `.conversation_log (conversation_id, kind, name, payload)
			VALUES ($1, 'event', 'approval', jsonb_build_object('event_id', $2::bigint))`, []any{b.conv, undelivered.ID}, guardrules.SQLStateRecord},
		{"an event entry addressed to another task than its event", `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, name, payload)
			VALUES ($1, $2, 'event', 'note', jsonb_build_object('event_id', $3::bigint))`, []any{b.conv, run.ID, undelivered.ID}, guardrules.SQLStateRecord},
		{"an entry of no conversation", `INSERT INTO ` + s + `.conversation_log (conversation_id, kind, name, payload)
			VALUES ($1 || '-nowhere', 'event', 'note', jsonb_build_object('event_id', $2::bigint))`, []any{b.conv, undelivered.ID}, guardrules.SQLStateRecord},
		{"an entry naming a task of another conversation", `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, status, name)
			VALUES ($1, $2, 'status', 'pending', 'turn')`, []any{b.conv, foreign.ID}, guardrules.SQLStateRecord},
		{"an entry stamped in the future", `INSERT INTO ` + s + `.conversation_log (conversation_id, task_id, kind, status, name, at)
			VALUES ($1, $2, 'status', 'pending', 'turn', now() + interval '1 hour')`, []any{b.conv, run.ID}, guardrules.SQLStateRecord},

		{"an event's payload rewritten", `UPDATE ` + s + `.events SET payload = '{"approved": true}' WHERE id = $1`, []any{delivered.ID}, guardrules.SQLStateRecord},
		{"an event's name rewritten", `UPDATE ` + s + `.events SET name = 'approval' WHERE id = $1`, []any{undelivered.ID}, guardrules.SQLStateRecord},
		{"an event undelivered", `UPDATE ` + s + `.events SET delivered_to = NULL, delivered_at = NULL WHERE id = $1`, []any{delivered.ID}, guardrules.SQLStateRecord},
		{"an event delivered again", `UPDATE ` + s + `.events SET delivered_to = $2, delivered_at = now() - interval '1 hour' WHERE id = $1`, []any{delivered.ID, run.ID}, guardrules.SQLStateRecord},
		{"an event delivered to a task that does not await it", `UPDATE ` + s + `.events SET delivered_to = $2, delivered_at = now() WHERE id = $1`, []any{undelivered.ID, run.ID}, guardrules.SQLStateRecord},
		{"an event inserted delivered", `INSERT INTO ` + s + `.events (conversation_id, name, payload, queued, delivered_to, delivered_at)
			VALUES ($1, 'approval', '{"approved": true}', true, $2, now())`, []any{b.conv, run.ID}, guardrules.SQLStateRecord},
		{"an event inserted in the past", `INSERT INTO ` + s + `.events (conversation_id, name, queued, emitted_at)
			VALUES ($1, 'approval', true, now() - interval '1 day')`, []any{b.conv}, guardrules.SQLStateRecord},
		{"an event deleted", `DELETE FROM ` + s + `.events WHERE id = $1`, []any{undelivered.ID}, guardrules.SQLStateDelete},
		{"the events truncated", `TRUNCATE ` + s + `.events CASCADE`, nil, guardrules.SQLStateDelete},

		{"a budget's spend lowered", `UPDATE ` + s + `.budgets SET spent = 0 WHERE conversation_id = $1`, []any{b.conv}, guardrules.SQLStateRecord},
		{"a budget's counter changed", `UPDATE ` + s + `.budgets SET counter = 'other' WHERE conversation_id = $1 AND task_id IS NOT NULL`, []any{b.conv}, guardrules.SQLStateRecord},
		{"spend carried off the prune path", `UPDATE ` + s + `.budgets SET carried = carried + 5, spent = spent + 5 WHERE conversation_id = $1 AND task_id IS NULL`, []any{b.conv}, guardrules.SQLStateRecord},
		{"a budget inserted with spend carried", `INSERT INTO ` + s + `.budgets (conversation_id, counter, max, carried, spent)
			VALUES ($1, 'forged', 10, 5, 5)`, []any{b.conv}, guardrules.SQLStateRecord},
		{"a budget deleted", `DELETE FROM ` + s + `.budgets WHERE conversation_id = $1`, []any{b.conv}, guardrules.SQLStateDelete},
		{"the budgets truncated", `TRUNCATE ` + s + `.budgets`, nil, guardrules.SQLStateDelete},

		{"a reservation made by no run", `INSERT INTO ` + s + `.budget_reservations (conversation_id, task_id, counter, run_token, idempotency_key, amount)
			VALUES ($1, $2, 'tokens', 424242, 'forged', 1)`, []any{b.conv, run.ID}, guardrules.SQLStateRecord},
		{"a reservation's amount changed", `UPDATE ` + s + `.budget_reservations SET amount = 1 WHERE id = $1`, []any{open}, guardrules.SQLStateRecord},
		{"a reservation recorded again", `UPDATE ` + s + `.budget_reservations SET actual = 0 WHERE id = $1`, []any{closed}, guardrules.SQLStateRecord},
		{"a reservation reopened", `UPDATE ` + s + `.budget_reservations SET actual = NULL, closed_at = NULL WHERE id = $1`, []any{closed}, guardrules.SQLStateRecord},
		{"a reservation closed in the past", `UPDATE ` + s + `.budget_reservations SET actual = 1, closed_at = now() - interval '1 day' WHERE id = $1`, []any{open}, guardrules.SQLStateRecord},
		{"a reservation deleted", `DELETE FROM ` + s + `.budget_reservations WHERE id = $1`, []any{open}, guardrules.SQLStateDelete},
		{"the reservations truncated", `TRUNCATE ` + s + `.budget_reservations`, nil, guardrules.SQLStateDelete},
	}
	for _, f := range forged {
		_, err := b.pool.Exec(b.ctx, f.sql, f.args...)
		requireSQLState(t, err, f.code)
		require.Equal(t, records, b.recordSnapshot(t), f.name+": nothing written")
		require.Equal(t, before, b.snapshot(t), f.name+": nothing written")
	}

	// The engine's own writes go on: the open reservation recorded, the
	// woken turn run to its end (the invariant checker runs at cleanup).
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (store.ReservationRow, error) {
		return b.engine.C.RecordBudget(b.ctx, tx, b.conv, run.ID, open, 3)
	})
	require.NoError(t, err)
	again := b.start(t, run.ID)
	_, err = b.engine.Complete(b.ctx, again.ID, again.Token, nil)
	require.NoError(t, err)
}

// TestGuardRefusesForgedHolders (issue 24): a holder row changes only as
// arbor changes it — inserted live and stamped now, renewed while live to
// a deadline never closer and at most a day away, deleted once it holds
// nothing, never truncated. Each forgery is refused with AB009 or AB006 and writes
// nothing; arbor's own renewal and end go on.
func TestGuardRefusesForgedHolders(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	l := b.lease(t)
	held := l.HolderID
	idle, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (int64, error) {
		id, _, err := b.engine.C.NewHolder(b.ctx, db, "idle-"+b.conv, time.Hour)
		return id, err
	})
	require.NoError(t, err)

	s := b.schema
	holders := func() string {
		var out string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(json_agg(h ORDER BY id)::text, '') FROM `+s+`.holders h WHERE id IN ($1, $2) OR name = 'forged-`+b.conv+`'`,
			held, idle).Scan(&out))
		return out
	}
	before, rows := b.snapshot(t), holders()
	forged := []struct {
		name, sql string
		args      []any
		code      string
	}{
		{"a holder inserted expired", `INSERT INTO ` + s + `.holders (name, expires_at) VALUES ('forged-` + b.conv + `', now() - interval '1 second')`, nil, guardrules.SQLStateRecord},
		{"a holder inserted born in the past", `INSERT INTO ` + s + `.holders (name, expires_at, created_at) VALUES ('forged-` + b.conv + `', now() + interval '1 hour', now() - interval '1 day')`, nil, guardrules.SQLStateRecord},
		{"a holder inserted renewed in the future", `INSERT INTO ` + s + `.holders (name, expires_at, renewed_at) VALUES ('forged-` + b.conv + `', now() + interval '1 hour', now() + interval '1 hour')`, nil, guardrules.SQLStateRecord},
		{"a live holder's deadline brought back", `UPDATE ` + s + `.holders SET expires_at = now(), renewed_at = now() WHERE id = $1`, []any{held}, guardrules.SQLStateRecord},
		{"a holder renewed without its stamp", `UPDATE ` + s + `.holders SET expires_at = expires_at + interval '1 hour' WHERE id = $1`, []any{held}, guardrules.SQLStateRecord},
		{"a holder renamed", `UPDATE ` + s + `.holders SET name = 'forged-` + b.conv + `' WHERE id = $1`, []any{held}, guardrules.SQLStateRecord},
		{"a holder's birth rewritten", `UPDATE ` + s + `.holders SET created_at = now() - interval '1 day' WHERE id = $1`, []any{idle}, guardrules.SQLStateRecord},
		{"a holder that holds a conversation deleted", `DELETE FROM ` + s + `.holders WHERE id = $1`, []any{held}, guardrules.SQLStateDelete},
		// Migration 025: a lease is at most a day. A deadline years away
		// held its conversations for good (the guard then refused to bring
		// it back, and the row could not go while it held them).
		{"a holder inserted with a deadline in 2400", `INSERT INTO ` + s + `.holders (name, expires_at) VALUES ('forged-` + b.conv + `', '2400-01-01')`, nil, guardrules.SQLStateRecord},
		{"a live holder renewed to 2400", `UPDATE ` + s + `.holders SET expires_at = '2400-01-01', renewed_at = now() WHERE id = $1`, []any{held}, guardrules.SQLStateRecord},
		{"a live holder renewed a day and a minute ahead", `UPDATE ` + s + `.holders SET expires_at = now() + interval '1 day 1 minute', renewed_at = now() WHERE id = $1`, []any{held}, guardrules.SQLStateRecord},
	}
	for _, f := range forged {
		_, err := b.pool.Exec(b.ctx, f.sql, f.args...)
		requireSQLState(t, err, f.code)
		require.Equal(t, rows, holders(), f.name+": nothing written")
		require.Equal(t, before, b.snapshot(t), f.name+": nothing written")
	}
	_, err = b.pool.Exec(b.ctx, `TRUNCATE `+s+`.holders CASCADE`)
	requireSQLState(t, err, guardrules.SQLStateDelete)
	require.Contains(t, err.Error(), "holders", "the holders' own guard refuses the truncate")
	require.Equal(t, rows, holders(), "truncate: nothing written")

	// An expired holder is not renewed by hand either (its conversations
	// may have been taken over).
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `UPDATE `+s+`.holders SET expires_at = now() - interval '1 second' WHERE id = $1`, idle)
		return err
	})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+s+`.holders SET expires_at = now() + interval '1 hour', renewed_at = now() WHERE id = $1`, idle)
	requireSQLState(t, err, guardrules.SQLStateRecord)

	// arbor's own: a renewal of the live holder (a shorter ttl leaves its
	// deadline; the longest lease there is, a day, is the bound), the end
	// of the idle one.
	ok, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (bool, error) { return b.engine.C.RenewHolder(b.ctx, db, held, time.Millisecond) })
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = core.Read(b.ctx, b.engine.C, func(db store.DB) (bool, error) { return b.engine.C.RenewHolder(b.ctx, db, held, 24*time.Hour) })
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = core.Read(b.ctx, b.engine.C, func(db store.DB) (bool, error) { return b.engine.C.EndHolder(b.ctx, db, idle) })
	require.NoError(t, err)
	require.True(t, ok)
}

// TestGuardRefusesUnexplainedBudgetSums (issue 24): a budget's spent and
// reserved move only as its scope's reservations do. A raise (or a
// lowering) no reservation row explains, written by hand, fails at its
// commit with AB009 and leaves nothing; a budget inserted with sums its
// scope never spent too. arbor's own reservations, records and spends in
// the same conversation pass.
func TestGuardRefusesUnexplainedBudgetSums(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}}, ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 1000}}})
	require.NoError(t, err)
	b.lease(t)
	run := b.start(t, turn.ID)
	res, err := b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
		Counter: "tokens", Amount: 10, Key: "open"})
	require.NoError(t, err)
	open := res.Reservation.ID

	s := b.schema
	before, records := b.snapshot(t), b.recordSnapshot(t)
	forged := []struct{ name, sql string }{
		{"the conversation's spend raised", `UPDATE ` + s + `.budgets SET spent = spent + 5 WHERE conversation_id = $1 AND task_id IS NULL`},
		{"a task's spend raised", `UPDATE ` + s + `.budgets SET spent = spent + 5 WHERE conversation_id = $1 AND task_id IS NOT NULL`},
		{"the reserved raised", `UPDATE ` + s + `.budgets SET reserved = reserved + 1 WHERE conversation_id = $1`},
		{"the reserved lowered", `UPDATE ` + s + `.budgets SET reserved = reserved - 10 WHERE conversation_id = $1`},
		{"the reserved moved into spend", `UPDATE ` + s + `.budgets SET reserved = reserved - 10, spent = spent + 10 WHERE conversation_id = $1`},
		{"a budget inserted with a spend", `INSERT INTO ` + s + `.budgets (conversation_id, counter, max, spent) VALUES ($1, 'forged', 10, 5)`},
	}
	for _, f := range forged {
		_, err := b.pool.Exec(b.ctx, f.sql, b.conv)
		requireSQLState(t, err, guardrules.SQLStateRecord)
		require.Equal(t, records, b.recordSnapshot(t), f.name+": nothing written")
		require.Equal(t, before, b.snapshot(t), f.name+": nothing written")
	}
	// Through the engine's transaction helper, the refusal at the commit is
	// an arbor error.
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (struct{}, error) {
		_, err := tx.Exec(b.ctx, `UPDATE `+s+`.budgets SET spent = spent + 5 WHERE conversation_id = $1`, b.conv)
		return struct{}{}, err
	})
	require.ErrorIs(t, err, arbortype.ErrInvalidTransition)
	require.Equal(t, records, b.recordSnapshot(t), "through Tx: nothing written")

	// arbor's own: a spend, the open reservation recorded, a late budget.
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
		Counter: "tokens", Amount: 5, Key: "spent", Spend: true})
	require.NoError(t, err)
	_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (store.ReservationRow, error) {
		return b.engine.C.RecordBudget(b.ctx, tx, b.conv, run.ID, open, 3)
	})
	require.NoError(t, err)
	_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
}

// TestGuardRefusesForgedDeaths (issue 41): a holder row ends before its
// deadline only as a proven death — once, while live, by another holder
// whose row is live, its deadline put in the past — and is never renewed
// after. Each forgery is refused with AB009 and writes nothing; arbor's own
// end of a dead life (EndDeadHolder) frees its conversation for a take-over.
func TestGuardRefusesForgedDeaths(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	l := b.lease(t) // the dead life, holding the conversation
	dead := l.HolderID
	type life struct {
		id      int64
		name    string
		created time.Time
	}
	newLife := func(name string, ttl time.Duration) life {
		lf, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (life, error) {
			id, created, err := b.engine.C.NewHolder(b.ctx, db, name, ttl)
			return life{id, name, created}, err
		})
		require.NoError(t, err)
		return lf
	}
	prover := newLife("prover-"+b.conv, time.Hour)
	expired := newLife("expired-"+b.conv, time.Millisecond)
	require.Eventually(t, func() bool { // its millisecond over, by the database's clock
		var live bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at >= now() FROM `+b.schema+`.holders WHERE id = $1`, expired.id).Scan(&live))
		return !live
	}, time.Minute, 5*time.Millisecond)
	var deadName string
	var deadBorn time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT name, created_at FROM `+b.schema+`.holders WHERE id = $1`, dead).Scan(&deadName, &deadBorn))

	s := b.schema
	holders := func() string {
		var out string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT json_agg(h ORDER BY id)::text FROM `+s+`.holders h WHERE id IN ($1, $2, $3)`,
			dead, prover.id, expired.id).Scan(&out))
		return out
	}
	before, rows := b.snapshot(t), holders()
	past := `now() - interval '1 microsecond'`
	forged := []struct {
		name, sql string
		args      []any
	}{
		{"a holder inserted ended", `INSERT INTO ` + s + `.holders (name, expires_at, ended_by) VALUES ('forged', now() + interval '1 hour', $1)`, []any{prover.id}},
		{"a holder ending itself", `UPDATE ` + s + `.holders SET expires_at = ` + past + `, ended_by = id WHERE id = $1`, []any{dead}},
		{"a holder ended by an expired one", `UPDATE ` + s + `.holders SET expires_at = ` + past + `, ended_by = $2 WHERE id = $1`, []any{dead, expired.id}},
		{"a holder ended by no holder", `UPDATE ` + s + `.holders SET expires_at = ` + past + `, ended_by = -1 WHERE id = $1`, []any{dead}},
		{"a holder ended with its deadline kept", `UPDATE ` + s + `.holders SET ended_by = $2 WHERE id = $1`, []any{dead, prover.id}},
		{"a holder ended and stamped renewed", `UPDATE ` + s + `.holders SET expires_at = ` + past + `, renewed_at = now() - interval '1 second', ended_by = $2 WHERE id = $1`, []any{dead, prover.id}},
		{"an expired holder ended", `UPDATE ` + s + `.holders SET expires_at = ` + past + `, ended_by = $2 WHERE id = $1`, []any{expired.id, prover.id}},
	}
	for _, f := range forged {
		_, err := b.pool.Exec(b.ctx, f.sql, f.args...)
		requireSQLState(t, err, guardrules.SQLStateRecord)
		require.Equal(t, rows, holders(), f.name+": nothing written")
		require.Equal(t, before, b.snapshot(t), f.name+": nothing written")
	}

	// The end names the life exactly: another name or birth ends nothing.
	end := func(id int64, name string, born time.Time, by int64) bool {
		ok, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (bool, error) {
			return b.engine.C.EndDeadHolder(b.ctx, db, id, name, born, by)
		})
		require.NoError(t, err)
		return ok
	}
	require.False(t, end(dead, deadName+"x", deadBorn, prover.id), "another name")
	require.False(t, end(dead, deadName, deadBorn.Add(time.Microsecond), prover.id), "another birth")
	require.False(t, end(dead, deadName, deadBorn, expired.id), "an expired prover")
	require.Equal(t, rows, holders())
	require.True(t, end(dead, deadName, deadBorn, prover.id))
	require.False(t, end(dead, deadName, deadBorn, prover.id), "ended once")

	// Ended: never renewed, by arbor or by hand, nor ended again.
	ok, err := core.Read(b.ctx, b.engine.C, func(db store.DB) (bool, error) { return b.engine.C.RenewHolder(b.ctx, db, dead, time.Hour) })
	require.NoError(t, err)
	require.False(t, ok, "an ended life's renewal finds it expired")
	_, err = b.pool.Exec(b.ctx, `UPDATE `+s+`.holders SET expires_at = now() + interval '1 hour', renewed_at = now() WHERE id = $1`, dead)
	requireSQLState(t, err, guardrules.SQLStateRecord)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+s+`.holders SET ended_by = NULL WHERE id = $1`, dead)
	requireSQLState(t, err, guardrules.SQLStateRecord)

	// Its conversation is free: a take-over bumps the epoch at once.
	taken, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.Lease, error) {
		l, _, err := b.engine.C.TakeLease(b.ctx, tx, b.conv, prover.name, prover.id)
		return l, err
	})
	require.NoError(t, err)
	require.Greater(t, taken.Epoch, l.Epoch)
}
