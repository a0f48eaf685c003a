package core_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// awaitBundle is a conversation whose turn runs, and the helpers of an
// approval's await under it.
type awaitBundle struct {
	*bundle
	turn arbortype.Task
}

func setupAwait(t *testing.T) *awaitBundle {
	t.Helper()
	return newAwaitBundle(t, setup(t))
}

func newAwaitBundle(t *testing.T, b *bundle) *awaitBundle {
	t.Helper()
	a := &awaitBundle{bundle: b, turn: b.start(t, b.root(t, "turn").ID)}
	t.Cleanup(func() {
		if _, err := b.engine.AbortConversation(b.ctx, b.conv); err != nil {
			t.Errorf("abort the conversation: %v", err)
		}
	})
	return a
}

// awaiting starts task id and parks it awaiting "approval" (timeout: 0
// for none), and returns the parked task with its token.
func (a *awaitBundle) awaiting(t *testing.T, id int64, timeout time.Duration) arbortype.Task {
	t.Helper()
	run := a.start(t, id)
	res, err := a.engine.AwaitEvent(a.ctx, run.ID, run.Token, core.AwaitParams{Name: "approval", Timeout: timeout, Phase: "decided"})
	require.NoError(t, err)
	require.False(t, res.Woken, "nothing waits for the await")
	require.NotEmpty(t, res.Task.AwaitToken)
	return res.Task
}

// timeOut is the await's timeout firing: the wake of its sleep, once the
// database's clock has reached it.
func (a *awaitBundle) timeOut(t *testing.T, task arbortype.Task) bool {
	t.Helper()
	woken, err := a.fireTimeout(task)
	require.NoError(t, err)
	return woken
}

// fireTimeout is timeOut for another goroutine than the test's.
func (a *awaitBundle) fireTimeout(task arbortype.Task) (bool, error) {
	for {
		woken, err := a.engine.WakeSleeping(a.ctx, task.ID, task.SleepSeq)
		var notDue *core.NotDueError
		if errors.As(err, &notDue) {
			time.Sleep(notDue.Remaining())
			continue
		}
		return woken, err
	}
}

// untouched records what the conversation holds — its row, tasks,
// events, log and wake jobs, with the transactions that last wrote them —
// and returns a check that nothing changed since.
func (a *awaitBundle) untouched(t *testing.T) func(what string) {
	t.Helper()
	read := func() string {
		var s string
		require.NoError(t, a.pool.QueryRow(a.ctx, `SELECT
			(SELECT coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM `+a.schema+`.tasks WHERE conversation_id = $1) || ' | ' ||
			(SELECT coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM `+a.schema+`.conversations WHERE id = $1) || ' | ' ||
			(SELECT coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM `+a.schema+`.events WHERE conversation_id = $1) || ' | ' ||
			(SELECT coalesce(string_agg(seq::text, ',' ORDER BY seq), '') FROM `+a.schema+`.conversation_log WHERE conversation_id = $1) || ' | ' ||
			(SELECT coalesce(string_agg(id || '@' || xmin::text, ',' ORDER BY id), '') FROM `+a.schema+`.river_job WHERE args->>'conversation_id' = $1)`,
			a.conv).Scan(&s))
		return s
	}
	before := read()
	return func(what string) {
		t.Helper()
		require.Equal(t, before, read(), "%s wrote something", what)
	}
}

// requireRefused posts token and requires ErrAwaitEnded, created false and
// nothing written.
func (a *awaitBundle) requireRefused(t *testing.T, token, what string) {
	t.Helper()
	check := a.untouched(t)
	ev, created, err := a.engine.EmitToken(a.ctx, token, json.RawMessage(`{"approved": true}`))
	require.ErrorIs(t, err, arbortype.ErrAwaitEnded, what)
	require.True(t, core.IsArborError(err))
	require.False(t, created, what)
	require.Zero(t, ev.ID, what)
	check(what)
}

// requireNotResumed requires task to be parked in its await, with no
// undelivered event of the conversation.
func (a *awaitBundle) requireNotResumed(t *testing.T, id int64) {
	t.Helper()
	cur := a.get(t, id)
	require.Equal(t, arbortype.StatusSleeping, cur.Status, "the await is still parked")
	require.Nil(t, cur.Delivered)
	var undelivered int
	require.NoError(t, a.pool.QueryRow(a.ctx, `SELECT count(*) FROM `+a.schema+`.events WHERE conversation_id = $1 AND delivered_to IS NULL`,
		a.conv).Scan(&undelivered))
	require.Zero(t, undelivered, "nothing waits for a later await")
}

// TestStaleAwaitTokenIsRefused: an await's token answers that await only.
// Posted after it ended — timed out, awaited again, cancelled, aborted,
// woken, answered otherwise — it is ErrAwaitEnded, writes nothing, and
// never reaches a later await of the same name.
func TestStaleAwaitTokenIsRefused(t *testing.T) {
	t.Parallel()
	t.Run("after a timeout", func(t *testing.T) {
		t.Parallel()
		a := setupAwait(t)
		aw := a.awaiting(t, a.child(t, a.turn.ID, "approver").ID, time.Millisecond)
		require.True(t, a.timeOut(t, aw))
		require.True(t, a.get(t, aw.ID).Delivered.TimedOut)
		a.requireRefused(t, aw.AwaitToken, "a token posted after its timeout")
	})
	t.Run("after a retried await of the same name", func(t *testing.T) {
		t.Parallel()
		a := setupAwait(t)
		id := a.child(t, a.turn.ID, "approver").ID
		first := a.awaiting(t, id, time.Millisecond)
		require.True(t, a.timeOut(t, first))
		// Late, between the timeout and the handler's next await: before,
		// this was kept, and the next await took it at once.
		a.requireRefused(t, first.AwaitToken, "a token posted between its timeout and the next await")
		second := a.awaiting(t, id, 0)
		require.NotEqual(t, first.AwaitToken, second.AwaitToken)
		a.requireRefused(t, first.AwaitToken, "the first await's token, posted during the second")
		a.requireNotResumed(t, id)

		ev, created, err := a.engine.EmitToken(a.ctx, second.AwaitToken, json.RawMessage(`"yes"`))
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, id, ev.DeliveredTo, "the second await's own token answers it")
	})
	for _, c := range []struct {
		name string
		end  func(a *awaitBundle, id int64) error
	}{
		{"after a cancel", func(a *awaitBundle, id int64) error { _, err := a.engine.Cancel(a.ctx, id, nil); return err }},
		{"after an abort", func(a *awaitBundle, id int64) error {
			_, err := a.engine.Abort(a.ctx, id, tasks.WithReason("stop"))
			return err
		}},
		{"after the turn's abort", func(a *awaitBundle, id int64) error { _, err := a.engine.Abort(a.ctx, a.turn.ID); return err }},
		{"after an early wake", func(a *awaitBundle, id int64) error { _, err := a.engine.WakeNow(a.ctx, id); return err }},
		{"after an event of its name to the conversation", func(a *awaitBundle, id int64) error {
			ev, _, err := a.engine.Emit(a.ctx, tasks.EmitParams{ConversationID: a.conv, Name: "approval", Payload: json.RawMessage(`"by name"`)})
			if err == nil && ev.DeliveredTo != id {
				err = errors.New("the event was not delivered to the await")
			}
			return err
		}},
		{"after its task settled", func(a *awaitBundle, id int64) error {
			if _, err := a.engine.WakeNow(a.ctx, id); err != nil {
				return err
			}
			run, err := a.engine.Start(a.ctx, id)
			if err != nil {
				return err
			}
			_, err = a.engine.Complete(a.ctx, id, run.Token, nil)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := setupAwait(t)
			aw := a.awaiting(t, a.child(t, a.turn.ID, "approver").ID, time.Hour)
			require.NoError(t, c.end(a, aw.ID))
			a.requireRefused(t, aw.AwaitToken, "a token posted "+c.name)
		})
	}
}

// TestAwaitTokenPostedTwice: the token is its emit's idempotency key.
// Posted again — while the task has not run yet, and after it awaited
// again — it returns the first emit, created false, and writes nothing.
func TestAwaitTokenPostedTwice(t *testing.T) {
	t.Parallel()
	a := setupAwait(t)
	id := a.child(t, a.turn.ID, "approver").ID
	aw := a.awaiting(t, id, time.Hour)
	first, created, err := a.engine.EmitToken(a.ctx, aw.AwaitToken, json.RawMessage(`{"approved": true}`))
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, id, first.DeliveredTo)
	require.Equal(t, "approval", first.Name)
	require.Equal(t, id, first.TaskID)

	again := func(what string) {
		t.Helper()
		check := a.untouched(t)
		ev, created, err := a.engine.EmitToken(a.ctx, aw.AwaitToken, json.RawMessage(`{"approved": false}`))
		require.NoError(t, err, what)
		require.False(t, created, what)
		require.Equal(t, first.ID, ev.ID, what)
		require.JSONEq(t, `{"approved": true}`, string(ev.Payload), "%s: the first emit", what)
		check(what)
	}
	again("a double click")
	require.Equal(t, first.ID, a.get(t, id).Delivered.EventID, "the await took the first answer")
	next := a.awaiting(t, id, 0)
	again("a retry after the task awaited again")
	a.requireNotResumed(t, next.ID)
}

// TestAwaitTokenRacesTheTimeout: a token posted as its await times out
// is, every round, exactly one of: the await's answer (delivered to it),
// or refused (the await timed out). Never both, never neither, and never
// an event kept for the next await of the name, which each round makes.
func TestAwaitTokenRacesTheTimeout(t *testing.T) {
	t.Parallel()
	a := setupAwait(t)
	id := a.child(t, a.turn.ID, "approver").ID
	answered, refused := 0, 0
	for round := range 40 {
		aw := a.awaiting(t, id, time.Millisecond)
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			ev       arbortype.Event
			created  bool
			postErr  error
			woken    bool
			timerErr error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			ev, created, postErr = a.engine.EmitToken(a.ctx, aw.AwaitToken, json.RawMessage(`"yes"`))
		}()
		go func() {
			defer wg.Done()
			<-start
			woken, timerErr = a.fireTimeout(aw)
		}()
		close(start)
		wg.Wait()
		require.NoError(t, timerErr, "round %d", round)

		cur := a.get(t, id)
		require.Equal(t, arbortype.StatusPending, cur.Status, "round %d: the await ended", round)
		require.NotNil(t, cur.Delivered, "round %d", round)
		switch {
		case postErr == nil:
			require.True(t, created, "round %d", round)
			require.False(t, woken, "round %d: answered, so the timeout found nothing to end", round)
			require.Equal(t, id, ev.DeliveredTo, "round %d: delivered to this await", round)
			require.Equal(t, ev.ID, cur.Delivered.EventID, "round %d", round)
			require.False(t, cur.Delivered.TimedOut, "round %d", round)
			answered++
		default:
			require.ErrorIs(t, postErr, arbortype.ErrAwaitEnded, "round %d", round)
			require.False(t, created, "round %d", round)
			require.True(t, woken, "round %d: refused because it timed out", round)
			require.True(t, cur.Delivered.TimedOut, "round %d", round)
			refused++
		}
		// The next await of the name is not answered by this round's token.
		next := a.awaiting(t, id, 0)
		a.requireNotResumed(t, id)
		_, err := a.engine.WakeNow(a.ctx, next.ID)
		require.NoError(t, err)
	}
	t.Logf("answered %d, refused %d", answered, refused)
}

// TestAwaitTokenForms: a token names its task; one of the older form
// (issued before tokens did) still answers the await that holds it.
func TestAwaitTokenForms(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Fresh(t) // the test disables the guard of its tasks table a moment
	a := newAwaitBundle(t, newBundle(t, pool, schema))
	aw := a.awaiting(t, a.child(t, a.turn.ID, "approver").ID, 0)
	require.Regexp(t, `^awt_[0-9]+_[0-9a-f]{32}$`, aw.AwaitToken)
	require.Contains(t, aw.AwaitToken, "awt_"+strconv.FormatInt(aw.ID, 10)+"_")

	// A token of the older form, as one parked before the upgrade holds it.
	old := aw.AwaitToken
	legacy := "awt_" + old[len(old)-32:]
	_, err := a.pool.Exec(a.ctx, `ALTER TABLE `+a.schema+`.tasks DISABLE TRIGGER USER;
		UPDATE `+a.schema+`.tasks SET await_token = '`+legacy+`' WHERE id = `+strconv.FormatInt(aw.ID, 10)+`;
		ALTER TABLE `+a.schema+`.tasks ENABLE TRIGGER USER`)
	require.NoError(t, err)
	ev, created, err := a.engine.EmitToken(a.ctx, legacy, nil)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, aw.ID, ev.DeliveredTo)
	_, created, err = a.engine.EmitToken(a.ctx, legacy, nil)
	require.NoError(t, err)
	require.False(t, created)

	// A token that names a task that does not exist was never issued.
	_, _, err = a.engine.EmitToken(a.ctx, "awt_999999999999_"+legacy[4:], nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, _, err = a.engine.EmitToken(a.ctx, "awt_forged", nil)
	require.ErrorIs(t, err, arbortype.ErrNotFound)
}

// TestDeliveryIsStampedAfterItsEmission: an await whose transaction began
// before the emit's, and reached the conversation's lock after the emit
// committed, takes the event stamped no earlier than its emission. Both
// stamps are their transactions' starts; the delivery's was the earlier
// one (a flush under load in a failover test: delivered 0.4 ms before it
// was emitted, which the checker's invariant 11 reports).
func TestDeliveryIsStampedAfterItsEmission(t *testing.T) {
	t.Parallel()
	a := setupAwait(t)
	tx, err := a.pool.Begin(a.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(a.ctx) }()
	var began time.Time
	require.NoError(t, tx.QueryRow(a.ctx, `SELECT now()`).Scan(&began))
	// The emit's transaction starts later, by the server's clock.
	// (The condition runs on a goroutine of Eventually's: it reports, it
	// does not FailNow.)
	require.Eventually(t, func() bool {
		var now time.Time
		return a.pool.QueryRow(a.ctx, `SELECT now()`).Scan(&now) == nil && now.After(began)
	}, 10*time.Second, time.Millisecond)
	ev, _, err := a.engine.Emit(a.ctx, tasks.EmitParams{ConversationID: a.conv, Name: "approval", Payload: json.RawMessage(`true`)})
	require.NoError(t, err)
	require.True(t, ev.EmittedAt.After(began))
	res, err := a.engine.C.AwaitEvent(a.ctx, tx, a.turn.ID, a.turn.Token, core.AwaitParams{Name: "approval"})
	require.NoError(t, err)
	require.True(t, res.Woken, "the await took the event emitted before it")
	require.NoError(t, tx.Commit(a.ctx))
	var emitted, delivered time.Time
	require.NoError(t, a.pool.QueryRow(a.ctx, `SELECT emitted_at, delivered_at FROM `+a.schema+`.events WHERE id = $1`, ev.ID).Scan(&emitted, &delivered))
	require.False(t, delivered.Before(emitted), "delivered %s, emitted %s", delivered, emitted)
	// The cleanup's checker agrees (invariant 11).
}
