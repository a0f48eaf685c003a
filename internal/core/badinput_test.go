package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// untouched records what a schema holds — the rows of every arbor table
// (holders, budgets and reservations included) and River's job table, with their xmin (the transaction that last wrote
// each) — and returns a check that nothing changed since.
func untouched(t *testing.T, pool *pgxpool.Pool, schema string) func(what string) {
	t.Helper()
	read := func() string {
		var s string
		err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.tasks) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.conversations) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.events) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(max(seq), 0) FROM %[1]s.conversation_log) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.holders) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(counter || coalesce(task_id, 0) || '@' || xmin::text, ',' ORDER BY counter, task_id), '') FROM %[1]s.budgets) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.budget_reservations) || ' | ' ||
			(SELECT count(*) || ':' || coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM %[1]s.river_job)`, schema)).Scan(&s)
		require.NoError(t, err)
		return s
	}
	before := read()
	return func(what string) {
		t.Helper()
		require.Equal(t, before, read(), "%s wrote something", what)
	}
}

// TestBadInputIsRefusedAndWritesNothing: each malformed input a user found
// reaching PostgreSQL raw (or accepted wrongly) gets a clear arbor error,
// and the schema's rows and their xmin stay as they were.
func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t)
	eng := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := context.Background()
	conv := testdb.Conversation(t)
	turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	run, err := eng.Start(ctx, turn.ID)
	require.NoError(t, err)
	// Tokens of awaits that are over: one cancelled, one woken early.
	staleToken := func(end func(id int64) error) string {
		child, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "approver", OwnerID: turn.ID})
		require.NoError(t, err)
		crun, err := eng.Start(ctx, child.ID)
		require.NoError(t, err)
		aw, err := eng.AwaitEvent(ctx, crun.ID, crun.Token, core.AwaitParams{Name: "approval", Timeout: time.Hour})
		require.NoError(t, err)
		require.NoError(t, end(child.ID))
		return aw.Task.AwaitToken
	}
	cancelled := staleToken(func(id int64) error { _, err := eng.Cancel(ctx, id, nil); return err })
	woken := staleToken(func(id int64) error { _, err := eng.WakeNow(ctx, id); return err })
	emitToken := func(token string) error {
		_, created, err := eng.EmitToken(ctx, token, []byte(`{"approved": true}`))
		if created {
			return fmt.Errorf("token %s: created", token)
		}
		return err
	}

	// What the refusals below name: a task of another conversation, a
	// settled task, a pending one, and a key already used.
	other := testdb.Conversation(t)
	foreign, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: other, Kind: "turn"})
	require.NoError(t, err)
	settled, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: other, Kind: "tool", OwnerID: foreign.ID})
	require.NoError(t, err)
	_, err = eng.Cancel(ctx, settled.ID, nil)
	require.NoError(t, err)
	pending, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "tool", OwnerID: turn.ID, IdempotencyKey: "once"})
	require.NoError(t, err)

	// What the forgeries below change: an await in progress, an event, a
	// budget and a node's holder row.
	awaiter, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "approver", OwnerID: turn.ID})
	require.NoError(t, err)
	arun, err := eng.Start(ctx, awaiter.ID)
	require.NoError(t, err)
	_, err = eng.AwaitEvent(ctx, arun.ID, arun.Token, core.AwaitParams{Name: "approval", Timeout: time.Hour})
	require.NoError(t, err)
	note, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: "note", Payload: []byte(`{"n": 1}`)})
	require.NoError(t, err)
	_, err = eng.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 100})
	require.NoError(t, err)
	holder, _, err := eng.C.NewHolder(ctx, pool, "node-"+conv, time.Hour)
	require.NoError(t, err)

	create := func(p arbortype.CreateParams) error {
		if p.ConversationID == "" {
			p.ConversationID = conv
		}
		if p.Kind == "" {
			p.Kind = "k"
		}
		_, _, err := eng.Create(ctx, p)
		return err
	}
	east := time.FixedZone("UTC+5", 5*3600)
	west := time.FixedZone("UTC-5", -5*3600)
	cases := []struct {
		name string
		op   func() error
		want error
	}{
		{"input with invalid UTF-8 inside a string", func() error { return create(arbortype.CreateParams{Input: []byte("{\"a\": \"\xff\xfe\"}")}) }, arbortype.ErrInvalidJSON},
		{"input with a number beyond numeric's range", func() error { return create(arbortype.CreateParams{Input: []byte(`{"n": 1e1000000}`)}) }, arbortype.ErrInvalidJSON},
		{"input with a \\u0000 escape", func() error { return create(arbortype.CreateParams{Input: []byte(`{"a": "\u0000"}`)}) }, arbortype.ErrInvalidJSON},
		{"input over the payload limit", func() error {
			return create(arbortype.CreateParams{Input: []byte(`"` + strings.Repeat("x", tasks.MaxPayloadBytesDefault) + `"`)})
		}, arbortype.ErrPayloadTooLarge},
		{"conversation id with a NUL", func() error { return create(arbortype.CreateParams{ConversationID: "a\x00b"}) }, arbortype.ErrInvalidArgument},
		{"conversation id with invalid UTF-8", func() error { return create(arbortype.CreateParams{ConversationID: "a\xffb"}) }, arbortype.ErrInvalidArgument},
		{"max retries over int32", func() error { return create(arbortype.CreateParams{MaxRetries: 1 << 31}) }, arbortype.ErrInvalidArgument},
		{"restart limit over int32", func() error { return create(arbortype.CreateParams{RestartLimit: 1 << 31}) }, arbortype.ErrInvalidArgument},
		{"a backoff below a microsecond", func() error { return create(arbortype.CreateParams{RetryBackoffBase: 500 * time.Nanosecond}) }, arbortype.ErrInvalidArgument},
		{"a key in arbor's own namespace", func() error { return create(arbortype.CreateParams{IdempotencyKey: "arbor:mine"}) }, arbortype.ErrInvalidArgument},
		{"Check of an id with a NUL", func() error { _, err := eng.Check(ctx, "a\x00b"); return err }, arbortype.ErrInvalidArgument},
		{"Check of an id with invalid UTF-8", func() error { _, err := eng.Check(ctx, "a\xffb"); return err }, arbortype.ErrInvalidArgument},
		{"ConversationTasks of an id with a NUL", func() error { _, err := eng.ConversationTasks(ctx, "a\x00b"); return err }, arbortype.ErrInvalidArgument},
		{"Conversation of an id with invalid UTF-8", func() error { _, err := eng.Conversation(ctx, "\xff"); return err }, arbortype.ErrInvalidArgument},
		{"AbortConversation of an id with a NUL", func() error { _, err := eng.AbortConversation(ctx, "\x00"); return err }, arbortype.ErrInvalidArgument},
		{"a wake time in year 10000 UTC", func() error {
			_, err := eng.SleepUntil(ctx, run.ID, run.Token, time.Date(9999, 12, 31, 23, 0, 0, 0, west), "", nil)
			return err
		}, arbortype.ErrInvalidArgument},
		{"a wake time in year 0 UTC", func() error {
			_, err := eng.SleepUntil(ctx, run.ID, run.Token, time.Date(1, 1, 1, 1, 0, 0, 0, east), "", nil)
			return err
		}, arbortype.ErrInvalidArgument},
		{"a checkpoint with invalid UTF-8 in its state", func() error {
			_, err := eng.Checkpoint(ctx, run.ID, run.Token, "p", []byte("\"\xc3\x28\""))
			return err
		}, arbortype.ErrInvalidJSON},
		{"a result beyond numeric's range", func() error {
			_, err := eng.Complete(ctx, run.ID, run.Token, []byte(`[1e1000000]`))
			return err
		}, arbortype.ErrInvalidJSON},
		{"the token of a cancelled await", func() error { return emitToken(cancelled) }, arbortype.ErrAwaitEnded},
		{"the token of an await woken early", func() error { return emitToken(woken) }, arbortype.ErrAwaitEnded},
		{"a token naming no task", func() error { return emitToken("awt_999999999999" + woken[strings.LastIndex(woken, "_"):]) }, arbortype.ErrNotFound},
		{"a forged token", func() error { return emitToken("awt_forged") }, arbortype.ErrNotFound},
		{"a holder name with a NUL", func() error { _, _, err := eng.C.NewHolder(ctx, pool, "node\x00b", time.Minute); return err }, arbortype.ErrInvalidArgument},
		{"a holder name with invalid UTF-8", func() error { _, _, err := eng.C.NewHolder(ctx, pool, "node\xff", time.Minute); return err }, arbortype.ErrInvalidArgument},
		// Issue 24: reserved names, budget lists.
		{"an emit of arbor's own event name", func() error {
			_, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: arbortype.BudgetEvent})
			return err
		}, arbortype.ErrInvalidArgument},
		{"a steer under arbor's own event name", func() error {
			return create(arbortype.CreateParams{OnBusy: arbortype.TurnSteer, SteerEvent: arbortype.BudgetEvent})
		}, arbortype.ErrInvalidArgument},
		{"a counter given twice in a create's budgets", func() error {
			return create(arbortype.CreateParams{Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 10}, {Counter: "tokens", Max: 20}}})
		}, arbortype.ErrInvalidArgument},
		{"a counter given twice in a create's conversation budgets", func() error {
			return create(arbortype.CreateParams{ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 10}, {Counter: "tokens", Max: 20}}})
		}, arbortype.ErrInvalidArgument},
		{"a create's budget list over the limit", func() error {
			var bs []arbortype.BudgetLimit
			for i := range core.MaxCreateBudgets + 1 {
				bs = append(bs, arbortype.BudgetLimit{Counter: fmt.Sprintf("c%d", i), Max: 1})
			}
			return create(arbortype.CreateParams{Budgets: bs})
		}, arbortype.ErrInvalidArgument},
		{"an emit of a name under arbor's prefix", func() error {
			_, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: "arbor:steer:1"})
			return err
		}, arbortype.ErrInvalidArgument},
		{"an emit keyed in arbor's own namespace", func() error {
			_, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, Name: "note", IdempotencyKey: "arbor:steer:1"})
			return err
		}, arbortype.ErrInvalidArgument},
		{"a budget over 2^53", func() error {
			_, err := eng.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv, Counter: "tokens", Max: 1 << 62})
			return err
		}, arbortype.ErrInvalidArgument},
		{"a budget of a task, named under a conversation that does not exist", func() error {
			_, err := eng.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv + "-none", TaskID: turn.ID, Counter: "tokens", Max: 5})
			return err
		}, arbortype.ErrNotFound},
		{"a fork into an id with a NUL", func() error {
			_, err := eng.Fork(ctx, tasks.ForkParams{ConversationID: conv, ThroughTurn: turn.ID, NewConversationID: "a\x00b"})
			return err
		}, arbortype.ErrInvalidArgument},
		// The brief's list: an unknown id, a foreign owner, a stale token,
		// an invalid transition, an owner that is no longer live.
		{"a Get of an unknown id", func() error { _, err := eng.Get(ctx, 1<<40); return err }, arbortype.ErrNotFound},
		{"a Cancel of an unknown id", func() error { _, err := eng.Cancel(ctx, 1<<40, nil); return err }, arbortype.ErrNotFound},
		{"a child under another conversation's task", func() error { return create(arbortype.CreateParams{OwnerID: foreign.ID}) }, arbortype.ErrForeignOwner},
		{"a child under an unknown task", func() error { return create(arbortype.CreateParams{OwnerID: 1 << 40}) }, arbortype.ErrNotFound},
		{"a child under a settled task", func() error {
			return create(arbortype.CreateParams{ConversationID: other, OwnerID: settled.ID})
		}, arbortype.ErrOwnerNotLive},
		{"a key reused for another task", func() error {
			return create(arbortype.CreateParams{Kind: "other", OwnerID: turn.ID, IdempotencyKey: "once"})
		}, arbortype.ErrIdempotencyConflict},
		{"a Complete under a stale token", func() error { _, err := eng.Complete(ctx, run.ID, run.Token+1, nil); return err }, arbortype.ErrLeaseLost},
		{"a Complete of a task never started", func() error { _, err := eng.Complete(ctx, pending.ID, 1, nil); return err }, arbortype.ErrNotRunning},
		{"a WakeNow of a task not asleep", func() error { _, err := eng.WakeNow(ctx, pending.ID); return err }, arbortype.ErrNotSleeping},
		{"an emit to another conversation's task", func() error {
			_, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, TaskID: foreign.ID, Name: "note"})
			return err
		}, arbortype.ErrForeignTask},
		{"an emit to a conversation that does not exist", func() error {
			_, _, err := eng.Emit(ctx, tasks.EmitParams{ConversationID: conv + "-none", Name: "note"})
			return err
		}, arbortype.ErrNotFound},
		{"a token with a payload over 64 KiB", func() error {
			_, _, err := eng.EmitToken(ctx, woken, []byte(`"`+strings.Repeat("x", core.MaxEventBytes)+`"`))
			return err
		}, arbortype.ErrPayloadTooLarge},
	}
	check := untouched(t, pool, schema)
	for _, c := range cases {
		err := c.op()
		require.ErrorIs(t, err, c.want, c.name)
		require.True(t, core.IsArborError(err), "%s: %v", c.name, err)
		// A refusal is not a fault of the database (issue 24: ordinary
		// refusals matched ErrDatabase).
		require.NotErrorIs(t, err, arbortype.ErrDatabase, c.name)
		require.NotErrorIs(t, err, arbortype.ErrUnavailable, c.name)
		check(c.name)
	}

	// Forgeries by hand (issue 24): a statement written past the engine, by
	// an application bug or a person at a SQL console, is refused by the
	// database's guards with arbor's code (the engine reports each as
	// ErrInvalidTransition; guardcodes_internal_test.go) and writes
	// nothing. Each runs in a transaction of its own, so that the checks
	// made at commit run too. The guard tests (guard_test.go,
	// record_guard_test.go) try every rule; these are the cases.
	sql := func(statements ...string) func() error {
		return func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				for _, st := range statements {
					if strings.Contains(st, "%[1]s") {
						st = fmt.Sprintf(st, schema)
					}
					if _, err := tx.Exec(ctx, st); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	forgeries := []struct {
		name string
		op   func() error
		code string
	}{
		{"a DELETE of a settled task off the prune path", sql(fmt.Sprintf(`DELETE FROM %%[1]s.tasks WHERE id = %d`, settled.ID)), guardrules.SQLStateDelete},
		{"a DELETE under the old prune setting, which any role may set", sql(`SET LOCAL arbor.prune = 'on'`, fmt.Sprintf(`DELETE FROM %%[1]s.tasks WHERE id = %d`, settled.ID)), guardrules.SQLStateDelete},
		{"a TRUNCATE of the tasks", sql(`TRUNCATE %[1]s.tasks CASCADE`), guardrules.SQLStateDelete},
		{"an approval forged on an awaiting task, with no event", sql(fmt.Sprintf(`UPDATE %%[1]s.tasks SET status = 'pending',
			delivered = '{"event_id": "%d", "payload": {"approved": true}}' WHERE id = %d`, note.ID, awaiter.ID)), guardrules.SQLStateColumn},
		{"a pending child inserted under a settled owner", sql(fmt.Sprintf(`INSERT INTO %%[1]s.tasks (conversation_id, owner_task_id, kind) VALUES (%s, %d, 'k')`,
			quote(other), settled.ID)), guardrules.SQLStateInvalidInsert},
		{"a fresh task stamped in 2400", sql(fmt.Sprintf(`INSERT INTO %%[1]s.tasks (conversation_id, kind, created_at) VALUES (%s, 'k', '2400-01-01')`,
			quote(conv))), guardrules.SQLStateInvalidInsert},
		{"a conversation's holder changed without its epoch", sql(fmt.Sprintf(`UPDATE %%[1]s.conversations SET holder = 'forged', holder_id = %d WHERE id = %s`,
			holder, quote(conv))), guardrules.SQLStateConversation},
		{"an event's payload rewritten", sql(fmt.Sprintf(`UPDATE %%[1]s.events SET payload = '{"n": 2}' WHERE id = %d`, note.ID)), guardrules.SQLStateRecord},
		{"an event delivered by hand to a task that does not await it", sql(fmt.Sprintf(`UPDATE %%[1]s.events SET delivered_to = %d, delivered_at = now() WHERE id = %d`,
			pending.ID, note.ID)), guardrules.SQLStateRecord},
		{"an event inserted delivered", sql(fmt.Sprintf(`INSERT INTO %%[1]s.events (conversation_id, name, delivered_to, delivered_at) VALUES (%s, 'approval', %d, now())`,
			quote(conv), awaiter.ID)), guardrules.SQLStateRecord},
		{"an event deleted", sql(fmt.Sprintf(`DELETE FROM %%[1]s.events WHERE id = %d`, note.ID)), guardrules.SQLStateDelete},
		{"the events truncated", sql(`TRUNCATE %[1]s.events`), guardrules.SQLStateDelete},
		{"a log entry rewritten", sql(`UPDATE %[1]s.conversation_log SET status = 'completed' WHERE kind = 'status'`), guardrules.SQLStateRecord},
		{"a log entry deleted", sql(`DELETE FROM %[1]s.conversation_log`), guardrules.SQLStateDelete},
		{"a settle logged for a running task", sql(fmt.Sprintf(`INSERT INTO %%[1]s.conversation_log (conversation_id, task_id, kind, status) VALUES (%s, %d, 'status', 'completed')`,
			quote(conv), turn.ID)), guardrules.SQLStateRecord},
		{"the log truncated", sql(`TRUNCATE %[1]s.conversation_log`), guardrules.SQLStateDelete},
		{"a budget's spend raised with no reservation", sql(`UPDATE %[1]s.budgets SET spent = spent + 5`), guardrules.SQLStateRecord},
		{"a budget moved to another counter", sql(`UPDATE %[1]s.budgets SET counter = 'other'`), guardrules.SQLStateRecord},
		{"spend carried outside the prune", sql(`UPDATE %[1]s.budgets SET carried = carried + 1`), guardrules.SQLStateRecord},
		{"a reservation made with no run", sql(fmt.Sprintf(`INSERT INTO %%[1]s.budget_reservations (conversation_id, task_id, counter, run_token, idempotency_key, amount)
			VALUES (%s, %d, 'tokens', 1, 'forged', 5)`, quote(conv), pending.ID)), guardrules.SQLStateRecord},
		{"the budgets truncated", sql(`TRUNCATE %[1]s.budgets CASCADE`), guardrules.SQLStateDelete},
		{"a live holder's deadline brought back", sql(fmt.Sprintf(`UPDATE %%[1]s.holders SET expires_at = now(), renewed_at = now() WHERE id = %d`, holder)), guardrules.SQLStateRecord},
		{"a holder's lease set to 2400", sql(fmt.Sprintf(`UPDATE %%[1]s.holders SET expires_at = '2400-01-01', renewed_at = now() WHERE id = %d`, holder)), guardrules.SQLStateRecord},
	}
	for _, f := range forgeries {
		err := f.op()
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", f.name, f.code, err)
		require.Equal(t, f.code, pgErr.Code, "%s: %s", f.name, pgErr.Message)
		require.True(t, strings.HasPrefix(pgErr.Message, "arbor: "), "%s: %s", f.name, pgErr.Message)
		check(f.name)
	}

	// A backslash before u0000 is text jsonb stores: it is accepted.
	doc, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "k", Input: []byte(`{"a": "\\u0000"}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"a": "\\u0000"}`, string(doc.Input))
	_, err = eng.AbortConversation(ctx, conv)
	require.NoError(t, err)
}

// TestBadConfigIsRefused: settings that would be silently wrong (a task
// lease running to the year 2319, a payload limit above jsonb's) are
// refused by name.
func TestBadConfigIsRefused(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	ctx := context.Background()
	for _, cfg := range []tasks.Config{
		{TaskLease: 1<<63 - 1},
		{MaxPayloadBytes: 1 << 30},
		{RestartLimit: 1 << 31},
		{UnavailableTimeout: -time.Second},
		{RetryBackoffBase: 100 * time.Nanosecond},
	} {
		cfg.Schema = schema
		_, err := tasks.New(ctx, pool, &cfg)
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%+v", cfg)
	}
	_, err := tasks.New(ctx, nil, nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
}

// quote renders s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
