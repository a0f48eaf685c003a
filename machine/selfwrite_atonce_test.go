package machine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// tracedEngine is an engine on a pool of its own whose statements sent
// under a counted context (see statementTracer) are kept.
func tracedEngine(t *testing.T, b *bundle) (*tasks.Engine, *statementTracer) {
	t.Helper()
	tracer := &statementTracer{}
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	return eng, tracer
}

// On the common path Run.Checkpoint, Run.Heartbeat and Run.Progress send
// one statement each, which commits on its own (issue 20: a checkpoint was
// BEGIN, the UPDATE and COMMIT; a progress entry BEGIN, a lock of the
// conversation, a read of the task, the INSERT and COMMIT). A refused one
// sends a second statement, the read that says why — ErrNotRunning,
// ErrLeaseLost, ErrAborted, as the transactions said — and writes nothing.
func TestRunSelfWritesAreOneStatementEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, tracer := tracedEngine(t, b)
	turn, _, err := eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, eng, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)

	calls := map[string]func(ctx context.Context, run *machine.Run) error{
		"checkpoint": func(ctx context.Context, run *machine.Run) error {
			return run.Checkpoint(ctx, "drafting", json.RawMessage(`{"page": 2}`))
		},
		"heartbeat": func(ctx context.Context, run *machine.Run) error { return run.Heartbeat(ctx) },
		"progress": func(ctx context.Context, run *machine.Run) error {
			return run.Progress(ctx, "token", json.RawMessage(`"Hel"`))
		},
	}
	sent := func(what string, f func(ctx context.Context) error, want error, statements int) {
		t.Helper()
		sql := tracer.sent(b.ctx, func(ctx context.Context) {
			err := f(ctx)
			if want == nil {
				require.NoError(t, err, what)
			} else {
				require.ErrorIs(t, err, want, what)
			}
		})
		require.Len(t, sql, statements, "%s: %q", what, sql)
	}

	before := b.get(t, turn.ID)
	for _, name := range []string{"checkpoint", "heartbeat", "progress"} {
		sent(name, func(ctx context.Context) error { return calls[name](ctx, run) }, nil, 1)
	}
	after := b.get(t, turn.ID)
	require.Equal(t, "drafting", after.Phase)
	require.JSONEq(t, `{"page": 2}`, string(after.State))
	require.Equal(t, "drafting", run.Task.Phase, "the run's view of its task follows its checkpoint")
	require.True(t, after.LeaseExpiresAt.After(*before.LeaseExpiresAt), "the lease was extended")
	entries, err := eng.ReadLog(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	progress := 0
	for _, e := range entries {
		if e.Kind == arbortype.LogKindProgress {
			progress++
			require.Equal(t, turn.ID, e.TaskID)
			require.Equal(t, "token", e.Name)
			require.JSONEq(t, `"Hel"`, string(e.Payload))
		}
	}
	require.Equal(t, 1, progress)

	refused := func(run *machine.Run, want error) {
		t.Helper()
		before := snapshot(t, b)
		head, err := eng.LogHead(b.ctx, b.conv)
		require.NoError(t, err)
		for _, name := range []string{"checkpoint", "heartbeat", "progress"} {
			sent(name, func(ctx context.Context) error { return calls[name](ctx, run) }, want, 2)
		}
		require.Equal(t, before, snapshot(t, b), "a refused write writes nothing")
		got, err := eng.LogHead(b.ctx, b.conv)
		require.NoError(t, err)
		require.Equal(t, head, got, "a refused progress appends nothing")
		require.True(t, run.Ended(), "a refused write ends the run")
	}
	// Taken over: the task is back to pending.
	_, err = b.engine.Recover(b.ctx, turn.ID)
	require.NoError(t, err)
	refused(run, arbortype.ErrNotRunning)
	// Started again: the first run's token is stale.
	rerun, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	refused(run, arbortype.ErrLeaseLost)
	// Aborted: the new run learns it at its next write.
	_, err = eng.Abort(b.ctx, turn.ID)
	require.NoError(t, err)
	refused(rerun, arbortype.ErrAborted)
	require.NoError(t, lease.Release(b.ctx))
	b.requireClean(t)
}

// A progress entry is one statement, so its snapshot is taken before it
// waits for the conversation's lock: an abort that commits while it waits
// must fence it off all the same (the task's row, share-locked after the
// conversation's, is checked at its newest version), and nothing is
// appended after the abort's entries.
func TestProgressFencedByAnAbortItWaitedFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	require.NoError(t, run.Progress(b.ctx, "token", json.RawMessage(`"before"`)))

	// The abort holds the conversation's row until the test commits it.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = b.engine.AbortTx(b.ctx, tx, turn.ID)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- run.Progress(b.ctx, "token", json.RawMessage(`"after"`)) }()
	waitUntil(t, "the progress entry to wait for the conversation's lock", func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%conversation_log%' AND query LIKE '%' || $1 || '%'`, b.schema) == 1
	})
	require.NoError(t, tx.Commit(b.ctx))
	require.ErrorIs(t, <-done, arbortype.ErrAborted)

	entries, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
	require.NoError(t, err)
	var payloads []string
	for _, e := range entries {
		if e.Kind == arbortype.LogKindProgress {
			payloads = append(payloads, string(e.Payload))
		}
	}
	require.Equal(t, []string{`"before"`}, payloads, "the entry fenced off was not appended")
	require.NoError(t, lease.Release(b.ctx))
	b.requireClean(t)
}

// A progress entry takes the conversation's row lock before it locks the
// task's (the engine's order, so that it cannot deadlock with a
// transaction that holds the conversation and wants the task): while it
// waits for the task's row, the conversation's is already its own.
func TestProgressLocksTheConversationFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.ctx, `SELECT id FROM `+b.schema+`.tasks WHERE id = $1 FOR NO KEY UPDATE`, turn.ID)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- run.Progress(b.ctx, "token", json.RawMessage(`"x"`)) }()
	waitUntil(t, "the progress entry to wait for the task's lock", func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%conversation_log%' AND query LIKE '%' || $1 || '%'`, b.schema) == 1
	})
	probe, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = probe.Exec(b.ctx, `SELECT id FROM `+b.schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE NOWAIT`, b.conv)
	require.Error(t, err, "the conversation's row is held by the waiting progress entry")
	var pgErr interface{ SQLState() string }
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.SQLState(), "lock_not_available")
	require.NoError(t, probe.Rollback(b.ctx))

	require.NoError(t, tx.Rollback(b.ctx))
	require.NoError(t, <-done)
	require.NoError(t, lease.Release(b.ctx))
	b.requireClean(t)
}
