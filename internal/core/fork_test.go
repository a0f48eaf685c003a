package core_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// requireCopy checks that conversation copy holds a faithful copy of
// original's tasks want (in order), and passes the checker.
func requireCopy(t *testing.T, b *bundle, copyID string, want []arbortype.Task) []arbortype.Task {
	t.Helper()
	got, err := b.engine.ConversationTasks(b.ctx, copyID)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	newOf := map[int64]int64{}
	for i, w := range want {
		g := got[i]
		newOf[w.ID] = g.ID
		require.NotEqual(t, w.ID, g.ID)
		require.Equal(t, copyID, g.ConversationID)
		require.Equal(t, newOf[w.OwnerID], g.OwnerID, "owner remapped")
		require.Equal(t, w.Kind, g.Kind)
		require.Equal(t, w.Status, g.Status)
		require.JSONEq(t, string(orNull(w.Result)), string(orNull(g.Result)))
		require.Equal(t, w.Attempt, g.Attempt)
		require.Equal(t, w.SettledAt, g.SettledAt)
	}
	vs, err := b.engine.Check(b.ctx, copyID)
	require.NoError(t, err)
	require.Empty(t, vs)
	return got
}

func orNull(j []byte) []byte {
	if len(j) == 0 {
		return []byte("null")
	}
	return j
}

// A fork through a turn copies the settled turns up to it with their
// subtrees, events and log, and nothing after it; the original is not
// written; a new turn runs in the copy.
func TestForkThroughATurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := settledTurn(t, b)
	second := settledTurn(t, b)
	live := b.root(t, "turn")
	before := b.snapshot(t)
	all, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)

	f, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: first.ID})
	require.NoError(t, err)
	require.Equal(t, tasks.Forked{ConversationID: f.ConversationID, Tasks: 2, Events: 1, LogEntries: f.LogEntries}, f)
	requireCopy(t, b, f.ConversationID, all[:2])
	require.Equal(t, before, b.snapshot(t), "the original is not written")

	f2, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: second.ID, NewConversationID: testdb.Conversation(t)})
	require.NoError(t, err)
	got := requireCopy(t, b, f2.ConversationID, all[:4])
	require.Equal(t, "answer", string(got[2].Result[1:len(got[2].Result)-1]))

	// The copy's log reads like the original's, up to the copied turn's
	// end, with the copies' ids.
	orig, err := b.engine.ReadLog(b.ctx, b.conv, 0, 1000)
	require.NoError(t, err)
	copied, err := b.engine.ReadLog(b.ctx, f2.ConversationID, 0, 1000)
	require.NoError(t, err)
	require.EqualValues(t, len(copied), f2.LogEntries)
	require.NotEmpty(t, copied)
	for i, c := range copied {
		require.Equal(t, orig[i].Kind, c.Kind)
		require.Equal(t, orig[i].Status, c.Status)
		if orig[i].TaskID != 0 {
			require.NotEqual(t, orig[i].TaskID, c.TaskID)
		}
	}

	// A new turn in the copy: edit and regenerate.
	regen, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: f.ConversationID, Kind: "turn"})
	require.NoError(t, err)
	_, err = b.engine.Cancel(b.ctx, regen.ID, nil)
	require.NoError(t, err)
	vs, err := b.engine.Check(b.ctx, f.ConversationID)
	require.NoError(t, err)
	require.Empty(t, vs)
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

// Bad input is refused with arbor's errors and writes nothing.
func TestForkBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := settledTurn(t, b)
	live := b.root(t, "turn")
	child := b.child(t, live.ID, "tool")
	other := setup(t)
	foreign := other.root(t, "turn")
	_, err := other.engine.Cancel(other.ctx, foreign.ID, nil)
	require.NoError(t, err)
	taken := testdb.Conversation(t)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: taken, Kind: "x"})
	require.NoError(t, err)
	_, err = b.engine.AbortConversation(b.ctx, taken)
	require.NoError(t, err)
	// What a fork of this conversation could write: copies of its tasks
	// anywhere, and anything in the taken conversation; and the original.
	count := func() string {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM `+b.schema+`.tasks
			WHERE forked_from IN (SELECT id FROM `+b.schema+`.tasks WHERE conversation_id = $1) OR conversation_id = $2)`, b.conv, taken).Scan(&n))
		return strconv.Itoa(n) + b.snapshot(t)
	}
	for _, c := range []struct {
		name string
		p    tasks.ForkParams
		want error
	}{
		{"unknown conversation", tasks.ForkParams{ConversationID: "no_such_conversation", ThroughTurn: done.ID}, arbortype.ErrNotFound},
		{"unknown turn", tasks.ForkParams{ConversationID: b.conv, ThroughTurn: 1 << 60}, arbortype.ErrNotFound},
		{"a turn of another conversation", tasks.ForkParams{ConversationID: b.conv, ThroughTurn: foreign.ID}, arbortype.ErrForeignTask},
		{"a live turn", tasks.ForkParams{ConversationID: b.conv, ThroughTurn: live.ID}, arbortype.ErrNotSettled},
		{"a child", tasks.ForkParams{ConversationID: b.conv, ThroughTurn: child.ID}, arbortype.ErrNotRoot},
		{"a taken id", tasks.ForkParams{ConversationID: b.conv, ThroughTurn: done.ID, NewConversationID: taken}, arbortype.ErrConversationExists},
		{"no conversation", tasks.ForkParams{ThroughTurn: done.ID}, arbortype.ErrInvalidArgument},
		{"no turn", tasks.ForkParams{ConversationID: b.conv}, arbortype.ErrInvalidArgument},
	} {
		n := count()
		_, err := b.engine.Fork(b.ctx, c.p)
		require.ErrorIs(t, err, c.want, c.name)
		require.NotErrorIs(t, err, arbortype.ErrDatabase, "%s: a refusal, not a database error", c.name)
		require.Equal(t, n, count(), c.name+": nothing written")
	}
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

// Settled rows inserted off the fork path, or forks that are not
// faithful copies of a settled task, are refused by the database.
func TestGuardRefusesForgedForks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := settledTurn(t, b)
	live := b.root(t, "turn")
	s := b.schema
	copyWith := func(src int64, conv, result, settle, trace, waitIDs string) string {
		return `INSERT INTO ` + s + `.tasks (id, conversation_id, kind, status, background, input, phase, state, result, error,
			attempt, restart_limit, abandon_on_restart, abort_requested, wait_policy, wait_ids, wake_at, sleep_seq, max_retries, retries,
			settle_seq, created_at, started_at, settled_at, retry_backoff_base, retry_backoff_cap, error_history, await_name, delivered, deadline, trace, forked_from,
			tenant, priority, queue_at, queue_expires_at, concurrency_key)
			OVERRIDING SYSTEM VALUE
			SELECT nextval(pg_get_serial_sequence('` + s + `.tasks', 'id')), '` + conv + `', kind, status, background, input, phase, state, ` + result + `, error,
			attempt, restart_limit, abandon_on_restart, abort_requested, wait_policy, ` + waitIDs + `, wake_at, sleep_seq, max_retries, retries,
			` + settle + `, created_at, started_at, settled_at, retry_backoff_base, retry_backoff_cap, error_history, await_name, delivered, deadline, ` + trace + `, id,
			tenant, priority, queue_at, queue_expires_at, concurrency_key
			FROM ` + s + `.tasks WHERE id = ` + itoa(src)
	}
	copyOf := func(src int64, conv string, change string) string {
		return copyWith(src, conv, change, `nextval('`+s+`.task_settle_seq')`, "trace", "wait_ids")
	}
	target := testdb.Conversation(t)
	for _, f := range []struct {
		name, sql, code string
	}{
		{"a settled row, not forked", `INSERT INTO ` + s + `.tasks (conversation_id, kind, status, settle_seq, settled_at, started_at) VALUES ('` + target + `', 'x', 'completed', 1, now(), now())`, guardrules.SQLStateInvalidInsert},
		{"forked from nothing", `INSERT INTO ` + s + `.tasks (conversation_id, kind, forked_from) VALUES ('` + target + `', 'x', 424242424242)`, guardrules.SQLStateFork},
		{"a changed result", copyOf(done.ID, target, `'"forged"'::jsonb`), guardrules.SQLStateFork},
		{"a copy of a live task", copyOf(live.ID, target, "result"), guardrules.SQLStateFork},
		{"a copy into its own conversation", copyOf(done.ID, b.conv, "result"), guardrules.SQLStateFork},
		// Issue 24: accepted before.
		{"a forged trace", copyWith(done.ID, target, "result", `nextval('`+s+`.task_settle_seq')`, `'{"traceparent": "forged"}'::jsonb`, "wait_ids"), guardrules.SQLStateFork},
		{"a negative settle number", copyWith(done.ID, target, "result", "-5", "trace", "wait_ids"), guardrules.SQLStateFork},
		{"waited children that are not copies", copyWith(done.ID, target, "result", `nextval('`+s+`.task_settle_seq')`, "trace", "ARRAY[1]::bigint[]"), guardrules.SQLStateFork},
	} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.conversations (id) VALUES ($1) ON CONFLICT DO NOTHING`, target); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, f.sql)
			return err
		})
		requireSQLState(t, err, f.code)
	}
	// The faithful copy is what the fork path makes; the guard lets it in.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.conversations (id) VALUES ($1)`, target); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, copyOf(done.ID, target, "result"))
		return err
	})
	require.NoError(t, err)
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

// Forks taken while turns are created and settled on the conversation
// each copy one consistent moment: a prefix of its turns, each whole, and
// the copy passes the checker.
func TestForkWhileTheConversationGetsNewTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.root(t, "turn")
	_, err := b.engine.Cancel(b.ctx, first.ID, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 20 {
			r, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
			if err != nil {
				t.Error(err)
				return
			}
			if _, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: r.ID, Kind: "tool"}); err != nil {
				t.Error(err)
				return
			}
			if _, err := b.engine.Cancel(b.ctx, r.ID, nil); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var forks []string
	for range 10 {
		f, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: latestSettled(t, b)})
		require.NoError(t, err)
		forks = append(forks, f.ConversationID)
	}
	wg.Wait()
	all, err := b.engine.ConversationTasks(b.ctx, b.conv)
	require.NoError(t, err)
	for _, c := range forks {
		got, err := b.engine.ConversationTasks(b.ctx, c)
		require.NoError(t, err)
		require.Equal(t, 1, len(got)%2, "whole turns: the first alone, then each root with its child")
		requireCopy(t, b, c, all[:len(got)])
	}
}

func latestSettled(t *testing.T, b *bundle) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT max(id) FROM `+b.schema+`.tasks
		WHERE conversation_id = $1 AND owner_task_id IS NULL AND settled_at IS NOT NULL`, b.conv).Scan(&id))
	return id
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestGuardRefusesForkCopiesWaitingOnForeignTasks (issue 24): a fork's
// copy waits on exactly the copies of its source's waited children. The
// insert guard can refuse only waited ids not above the copy's own (its
// children are inserted after it); an id above it passed — one a task of
// another conversation took, or none took — and the copy waited on a
// foreign task. The check at commit (the schema baseline) refuses those, and a
// copy that leaves out a copied waited child; the fork's own copy passes.
func TestGuardRefusesForkCopiesWaitingOnForeignTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, root.ID)
	child := b.child(t, run.ID, "tool")
	_, err := b.engine.WaitForChildren(b.ctx, run.ID, run.Token, core.WaitParams{ChildIDs: []int64{child.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	crun := b.start(t, child.ID)
	_, err = b.engine.Complete(b.ctx, crun.ID, crun.Token, nil)
	require.NoError(t, err)
	run = b.start(t, root.ID)
	done, err := b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{child.ID}, done.WaitIDs)

	s := b.schema
	// copyTask inserts a copy of task src as id into the target
	// conversation, under owner (0: a root), waiting on waits.
	copyTask := `INSERT INTO ` + s + `.tasks (id, conversation_id, owner_task_id, kind, status, background, input, phase, state, result, error,
		attempt, restart_limit, abandon_on_restart, abort_requested, wait_policy, wait_ids, wake_at, sleep_seq, max_retries, retries,
		settle_seq, created_at, started_at, settled_at, retry_backoff_base, retry_backoff_cap, error_history, await_name, delivered, deadline, trace, forked_from)
		OVERRIDING SYSTEM VALUE
		SELECT $1, $2, nullif($3::bigint, 0), kind, status, background, input, phase, state, result, error,
		attempt, restart_limit, abandon_on_restart, abort_requested, wait_policy, CASE WHEN wait_ids IS NOT NULL THEN $4::bigint[] END, wake_at, sleep_seq, max_retries, retries,
		nextval('` + s + `.task_settle_seq'), created_at, started_at, settled_at, retry_backoff_base, retry_backoff_cap, error_history, await_name, delivered, deadline, trace, id
		FROM ` + s + `.tasks WHERE id = $5`
	target := testdb.Conversation(t)
	for _, forgery := range []string{"waits on a task another conversation took", "waits on no task", "leaves its copied child out of its wait"} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			// Two ids of the table's sequence: the copy's, and the next.
			var copyID, next int64
			if err := tx.QueryRow(b.ctx, `SELECT nextval(pg_get_serial_sequence('`+s+`.tasks', 'id')), nextval(pg_get_serial_sequence('`+s+`.tasks', 'id'))`).
				Scan(&copyID, &next); err != nil {
				return err
			}
			if _, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.conversations (id) VALUES ($1)`, target); err != nil {
				return err
			}
			waits := []int64{next}
			if forgery == "leaves its copied child out of its wait" {
				waits = []int64{}
			}
			if _, err := tx.Exec(b.ctx, copyTask, copyID, target, 0, waits, done.ID); err != nil {
				return err
			}
			switch forgery {
			case "waits on a task another conversation took":
				_, err := tx.Exec(b.ctx, `INSERT INTO `+s+`.tasks (id, conversation_id, kind) OVERRIDING SYSTEM VALUE VALUES ($1, $2, 'k')`, next, b.conv)
				return err
			case "leaves its copied child out of its wait":
				_, err := tx.Exec(b.ctx, copyTask, next, target, copyID, []int64{}, child.ID)
				return err
			}
			return nil
		})
		requireSQLState(t, err, guardrules.SQLStateFork)
	}
	_, err = b.engine.Conversation(b.ctx, target)
	require.ErrorIs(t, err, arbortype.ErrNotFound, "nothing written")

	// The fork's own copy of the same turn passes.
	forked, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: done.ID})
	require.NoError(t, err)
	copies, err := b.engine.ConversationTasks(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Len(t, copies, 2)
	require.Equal(t, []int64{copies[1].ID}, copies[0].WaitIDs)
	vs, err := b.engine.Check(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// TestForkOfATurnAbortedWhileWaitingOnABackgroundTask (issue 24): a task
// aborted while it waited on a background child leaves that child live (an
// abort does not reach background children); the fork copies settled
// tasks only, so the copy waits on what was copied — nothing here. The
// guard required as many waited ids as the source's and refused the fork
// (AB008, ErrInvalidTransition).
func TestForkOfATurnAbortedWhileWaitingOnABackgroundTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root := b.root(t, "turn")
	b.lease(t)
	run := b.start(t, root.ID)
	watcher := b.background(t, run.ID, "watcher")
	_, err := b.engine.WaitForChildren(b.ctx, run.ID, run.Token, core.WaitParams{ChildIDs: []int64{watcher.ID}, Policy: arbortype.AllSettled})
	require.NoError(t, err)
	_, err = b.engine.Abort(b.ctx, root.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, b.get(t, watcher.ID).Status, "the background child lives on")

	forked, err := b.engine.Fork(b.ctx, tasks.ForkParams{ConversationID: b.conv, ThroughTurn: root.ID})
	require.NoError(t, err)
	copies, err := b.engine.ConversationTasks(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Len(t, copies, 1, "the live background child is not copied")
	require.Equal(t, arbortype.StatusAborted, copies[0].Status)
	require.Empty(t, copies[0].WaitIDs)
	vs, err := b.engine.Check(b.ctx, forked.ConversationID)
	require.NoError(t, err)
	require.Empty(t, vs)
	_, err = b.engine.AbortConversation(b.ctx, b.conv)
	require.NoError(t, err)
}
