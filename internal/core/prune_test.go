package core_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// settledTurn makes a turn of b's conversation that settled with a
// child, an event delivered to the root (by an await), and a wake job that
// River completed (a sleep woken by its job), and returns the root.
func settledTurn(t *testing.T, b *bundle) arbortype.Task {
	t.Helper()
	root := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, root.ID)
	child := b.child(t, run.ID, "tool")
	crun := b.start(t, child.ID)
	slept, err := b.engine.SleepUntil(b.ctx, crun.ID, crun.Token, time.Now().Add(-time.Second), "napping", nil)
	require.NoError(t, err)
	// River's worker holds the job while it wakes the sleep, then marks it
	// completed: the row stays behind the wake, as River leaves it.
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1`, slept.WakeJobID)
	require.NoError(t, err)
	woken, err := b.engine.WakeSleeping(b.ctx, child.ID, slept.SleepSeq)
	require.NoError(t, err)
	require.True(t, woken)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, slept.WakeJobID)
	require.NoError(t, err)
	crun = b.start(t, child.ID)
	_, err = b.engine.Complete(b.ctx, crun.ID, crun.Token, js(`"tool done"`))
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: run.ID, Name: "approve", Payload: js(`true`)})
	require.NoError(t, err)
	aw, err := b.engine.AwaitEvent(b.ctx, run.ID, run.Token, core.AwaitParams{Name: "approve"})
	require.NoError(t, err)
	require.True(t, aw.Woken)
	run = b.start(t, root.ID)
	done, err := b.engine.Complete(b.ctx, run.ID, run.Token, js(`"answer"`))
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, done.Status)
	return done
}

// rowsOf counts the rows of conv in every table a prune deletes from.
func rowsOf(t *testing.T, b *bundle, conv string) (tasksN, events, log, jobs int) {
	t.Helper()
	err := b.pool.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM `+b.schema+`.tasks WHERE conversation_id = $1),
		(SELECT count(*) FROM `+b.schema+`.events WHERE conversation_id = $1),
		(SELECT count(*) FROM `+b.schema+`.conversation_log WHERE conversation_id = $1),
		(SELECT count(*) FROM `+b.schema+`.river_job WHERE args->>'conversation_id' = $1)`, conv).Scan(&tasksN, &events, &log, &jobs)
	require.NoError(t, err)
	return
}

// setupPrune is setup on a schema of the test's own: a prune reaches
// every conversation of its schema.
func setupPrune(t *testing.T) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	return newBundle(t, pool, schema)
}

func prune(t *testing.T, b *bundle, p tasks.PruneParams) tasks.PruneResult {
	t.Helper()
	if p.OlderThan == 0 {
		p.OlderThan = time.Nanosecond
	}
	res, err := b.engine.Prune(b.ctx, p)
	require.NoError(t, err)
	return res
}

// A conversation in use loses its old turns with everything of theirs, and
// keeps its newest settled turn and its live one; the dry run counts
// exactly what the prune then deletes.
func TestPruneTurnsOfAConversationInUse(t *testing.T) {
	t.Parallel()
	b := setupPrune(t)
	old := settledTurn(t, b)
	newest := settledTurn(t, b)
	live := b.root(t, "turn")
	tasksBefore, eventsBefore, logBefore, jobsBefore := rowsOf(t, b, b.conv)
	require.Equal(t, 2, jobsBefore)

	dry := prune(t, b, tasks.PruneParams{DryRun: true})
	require.Equal(t, tasksBefore, func() int { n, _, _, _ := rowsOf(t, b, b.conv); return n }(), "a dry run deletes nothing")

	res := prune(t, b, tasks.PruneParams{})
	require.Equal(t, dry, res, "the dry run counted what the prune deleted")
	require.Equal(t, tasks.PruneResult{Turns: 1, Tasks: 2, Events: 1, WakeJobs: 1, LogEntries: res.LogEntries}, res)
	tasksAfter, eventsAfter, logAfter, jobsAfter := rowsOf(t, b, b.conv)
	require.Equal(t, tasksBefore-2, tasksAfter)
	require.Equal(t, eventsBefore-1, eventsAfter)
	require.Equal(t, jobsBefore-1, jobsAfter)
	require.Equal(t, logBefore-int(res.LogEntries), logAfter)
	require.Positive(t, res.LogEntries)

	_, err := b.engine.Get(b.ctx, old.ID)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	require.Equal(t, arbortype.StatusCompleted, b.get(t, newest.ID).Status)
	require.Equal(t, arbortype.StatusPending, b.get(t, live.ID).Status)
	require.Equal(t, tasks.PruneResult{}, prune(t, b, tasks.PruneParams{}), "the newest settled turn stays while the conversation is in use")
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

// A conversation with nothing live goes whole, row included, once no
// holder has its lease; a turn with a live background task stays whole.
func TestPruneWholeConversationAndLiveBackground(t *testing.T) {
	t.Parallel()
	b := setupPrune(t)
	settledTurn(t, b)
	settledTurn(t, b)
	res := prune(t, b, tasks.PruneParams{})
	require.Zero(t, res.Conversations, "the test's lease is held")
	require.EqualValues(t, 2, res.Turns)
	require.NoError(t, b.engine.ReleaseLease(b.ctx, b.conv))
	res = prune(t, b, tasks.PruneParams{})
	require.EqualValues(t, 1, res.Conversations, "the emptied conversation goes at the next prune")
	_, err := b.engine.Conversation(b.ctx, b.conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	n, ev, lg, jobs := rowsOf(t, b, b.conv)
	require.Equal(t, [4]int{}, [4]int{n, ev, lg, jobs})

	// A turn whose background task still runs is kept, with the settled
	// turn before it (the conversation is in use, and that one is its
	// newest settled turn)...
	b2 := setupPrune(t)
	root := b2.root(t, "turn")
	b2.lease(t)
	run := b2.start(t, root.ID)
	bg := b2.background(t, run.ID, "summarize")
	_, err = b2.engine.Complete(b2.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
	second := b2.root(t, "turn")
	_, err = b2.engine.Cancel(b2.ctx, second.ID, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.PruneResult{}, prune(t, b2, tasks.PruneParams{}))
	// ...until it settles: then nothing is live, and both turns go.
	_, err = b2.engine.Cancel(b2.ctx, bg.ID, nil)
	require.NoError(t, err)
	res = prune(t, b2, tasks.PruneParams{})
	require.Equal(t, tasks.PruneResult{Turns: 2, Tasks: 3, LogEntries: res.LogEntries}, res)
}

// A dry run counts exactly what the prune then deletes, over conversations
// out of use (one whose lease a holder keeps loses its tasks, not its row,
// own events and log, and is not counted deleted whole), and conversations
// in use.
func TestPruneDryRunCountsWhatThePruneDeletes(t *testing.T) {
	t.Parallel()
	held := setupPrune(t)
	free := newBundle(t, held.pool, held.schema)
	inUse := newBundle(t, held.pool, held.schema)
	for _, b := range []*bundle{held, free} {
		settledTurn(t, b)
		settledTurn(t, b)
		_, _, err := b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "note", Payload: js(`"kept for the next await"`)})
		require.NoError(t, err)
	}
	require.NoError(t, free.engine.ReleaseLease(free.ctx, free.conv))
	settledTurn(t, inUse)
	settledTurn(t, inUse)
	live := inUse.root(t, "turn")

	dry := prune(t, held, tasks.PruneParams{DryRun: true})
	res := prune(t, held, tasks.PruneParams{})
	require.Equal(t, dry, res, "the dry run counted what the prune deleted")
	require.EqualValues(t, 1, res.Conversations, "only the free conversation went whole")
	require.EqualValues(t, 5, res.Turns, "both turns of each conversation out of use, the older of the one in use")
	_, err := held.engine.Conversation(held.ctx, held.conv)
	require.NoError(t, err, "the held conversation keeps its row")
	n, ev, _, _ := rowsOf(t, held, held.conv)
	require.Equal(t, [2]int{0, 1}, [2]int{n, ev}, "its tasks went; its own event stays")
	_, err = free.engine.Conversation(free.ctx, free.conv)
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	// Released, the emptied conversation goes at the next prune: the dry
	// run says so first.
	require.NoError(t, held.engine.ReleaseLease(held.ctx, held.conv))
	dry = prune(t, held, tasks.PruneParams{DryRun: true})
	res = prune(t, held, tasks.PruneParams{})
	require.Equal(t, dry, res)
	require.Equal(t, tasks.PruneResult{Conversations: 1, Events: 1, LogEntries: res.LogEntries}, res)
	_, err = inUse.engine.Abort(inUse.ctx, live.ID)
	require.NoError(t, err)
}

// A batch smaller than a turn deletes it over several transactions,
// leaves first.
func TestPruneInSmallBatches(t *testing.T) {
	t.Parallel()
	b := setupPrune(t)
	root := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, root.ID)
	for range 6 {
		c := b.child(t, run.ID, "tool")
		b.child(t, c.ID, "sub")
	}
	_, err := b.engine.Cancel(b.ctx, run.ID, nil)
	require.NoError(t, err)
	b.root(t, "turn") // in use: a live turn
	_, err = b.engine.Cancel(b.ctx, b.root(t, "turn").ID, nil)
	require.NoError(t, err)
	res := prune(t, b, tasks.PruneParams{Batch: 4})
	require.Equal(t, tasks.PruneResult{Turns: 1, Tasks: 13, LogEntries: res.LogEntries}, res)
	_, err = b.engine.Get(b.ctx, root.ID)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}

// Deletes that are not the prune's, or that would remove a live task or
// what a live task reads, are refused by the database with AB006, and
// remove nothing.
func TestGuardRefusesForgedDeletes(t *testing.T) {
	t.Parallel()
	b := setupPrune(t)
	old := settledTurn(t, b)
	newest := settledTurn(t, b)
	live := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, live.ID)
	child := b.child(t, run.ID, "tool")
	crun := b.start(t, child.ID)
	_, err := b.engine.Complete(b.ctx, crun.ID, crun.Token, nil)
	require.NoError(t, err)
	before := b.snapshot(t)
	s := b.schema
	forged := []struct {
		name, sql string
		marked    bool
	}{
		{"a settled turn, off the prune path", `DELETE FROM ` + s + `.tasks WHERE id >= $1 AND conversation_id = $2 AND id < $3`, false},
		{"a live task", `DELETE FROM ` + s + `.tasks WHERE id = $3 AND $1::bigint IS NOT NULL AND $2::text IS NOT NULL`, true},
		{"a settled child of a live task", `DELETE FROM ` + s + `.tasks WHERE id = (SELECT max(id) FROM ` + s + `.tasks WHERE owner_task_id = $3) AND $1::bigint IS NOT NULL AND $2::text IS NOT NULL`, true},
		{"the newest settled turn of a conversation in use", `DELETE FROM ` + s + `.tasks WHERE id >= $1 AND conversation_id = $2 AND id < $3`, true},
		{"the whole conversation", `DELETE FROM ` + s + `.tasks WHERE conversation_id = $2 AND $1::bigint IS NOT NULL AND $3::bigint IS NOT NULL`, true},
		{"the conversation row", `DELETE FROM ` + s + `.conversations WHERE id = $2 AND $1::bigint IS NOT NULL AND $3::bigint IS NOT NULL`, true},
		{"the conversation row, off the prune path", `DELETE FROM ` + s + `.conversations WHERE id = $2 AND $1::bigint IS NOT NULL AND $3::bigint IS NOT NULL`, false},
	}
	for _, f := range forged {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if f.marked {
				if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.prune_marks DEFAULT VALUES`); err != nil {
					return err
				}
			}
			// The events of the turns go first, as the prune's would, so
			// that only the guard can refuse.
			if _, err := tx.Exec(b.ctx, `DELETE FROM `+s+`.events WHERE conversation_id = $1`, b.conv); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, f.sql, newest.ID, b.conv, live.ID)
			return err
		})
		requireSQLState(t, err, guardrules.SQLStateDelete)
		require.Equal(t, before, b.snapshot(t), f.name+": nothing removed")
	}
	_, err = b.pool.Exec(b.ctx, `TRUNCATE `+s+`.tasks CASCADE`)
	require.Error(t, err)
	require.Equal(t, before, b.snapshot(t))

	// The old turn alone, marked, with its events and log entries (as the
	// prune takes them): the guard allows it.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.prune_marks DEFAULT VALUES`); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `DELETE FROM `+s+`.events WHERE conversation_id = $1 AND (task_id < $2 OR delivered_to < $2)`, b.conv, newest.ID); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `DELETE FROM `+s+`.conversation_log WHERE conversation_id = $1 AND task_id < $2`, b.conv, newest.ID); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `DELETE FROM `+s+`.tasks WHERE conversation_id = $1 AND id >= $2 AND id < $3`, b.conv, old.ID, newest.ID)
		return err
	})
	require.NoError(t, err)
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

// A Create that races the prune of its conversation, which deletes its
// row, waits for the prune's lock and then makes the conversation afresh;
// an Emit, which needs an existing conversation, finds it gone
// (ErrNotFound), as it would after the prune. Neither sees a half-pruned
// conversation or fails otherwise.
func TestRaceCreateWhileThePruneDeletesTheConversation(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"create", "emit"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			b := setupPrune(t)
			done := b.root(t, "turn")
			_, err := b.engine.Cancel(b.ctx, done.ID, nil)
			require.NoError(t, err)
			r := newRacer(t, b)
			// The prune's last batch of the conversation, held open.
			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			_, err = tx.Exec(b.ctx, `SELECT 1 FROM `+b.schema+`.conversations WHERE id = $1 FOR UPDATE`, b.conv)
			require.NoError(t, err)
			_, err = tx.Exec(b.ctx, `INSERT INTO `+b.schema+`.prune_marks DEFAULT VALUES`)
			require.NoError(t, err)
			for _, q := range []string{`DELETE FROM ` + b.schema + `.conversation_log WHERE conversation_id = $1`,
				`DELETE FROM ` + b.schema + `.tasks WHERE conversation_id = $1`,
				`DELETE FROM ` + b.schema + `.conversations WHERE id = $1`} {
				_, err = tx.Exec(b.ctx, q, b.conv)
				require.NoError(t, err)
			}
			r.holder = tx
			var task arbortype.Task
			r.queue(func(e *enginetest.Engine) error {
				var err error
				if op == "create" {
					task, _, err = e.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
				} else {
					_, _, err = e.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, Name: "message"})
				}
				return err
			})
			require.NoError(t, tx.Commit(b.ctx))
			if err := <-r.done[0]; op == "emit" {
				require.ErrorIs(t, err, arbortype.ErrNotFound)
				return
			} else {
				require.NoError(t, err)
			}
			conv, err := b.engine.Conversation(b.ctx, b.conv)
			require.NoError(t, err)
			require.Zero(t, conv.Epoch, "a conversation made afresh")
			if op == "create" {
				require.Equal(t, arbortype.StatusPending, b.get(t, task.ID).Status)
				_, err = b.engine.Cancel(b.ctx, task.ID, nil)
				require.NoError(t, err)
			}
		})
	}
}
