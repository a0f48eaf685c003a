package core_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
)

// subject is a task brought to a status, with what it needs to move on.
type subject struct {
	task  arbortype.Task
	child arbortype.Task // a live foreground child, for waiting and completing subjects
	// failed is a failed child a waiting subject also waits on (all
	// settled), for the rerun edge.
	failed arbortype.Task
}

// reach creates a task (in a conversation of its own) and brings it to
// status through the engine's own operations.
func reach(t *testing.T, b *bundle, status arbortype.Status, started bool) subject {
	t.Helper()
	root := b.root(t, "subject")
	b.lease(t) // taken now, so that a later start under it writes no lease
	switch status {
	case arbortype.StatusPending:
		if started {
			run := b.start(t, root.ID)
			_, err := b.engine.Recover(b.ctx, run.ID)
			require.NoError(t, err)
		}
		return subject{task: b.get(t, root.ID)}
	case arbortype.StatusRunning:
		return subject{task: b.start(t, root.ID)}
	case arbortype.StatusWaiting:
		run := b.start(t, root.ID)
		child := b.child(t, run.ID, "child")
		failed := b.child(t, run.ID, "child")
		frun := b.start(t, failed.ID)
		failed, err := b.engine.Fail(b.ctx, frun.ID, frun.Token, arbortype.TaskError{Message: "boom"})
		require.NoError(t, err)
		res, err := b.engine.WaitForChildren(b.ctx, run.ID, run.Token, core.WaitParams{ChildIDs: []int64{child.ID, failed.ID}, Policy: arbortype.AllSettled})
		require.NoError(t, err)
		require.False(t, res.Woken)
		return subject{task: res.Task, child: child, failed: failed}
	case arbortype.StatusSleeping:
		run := b.start(t, root.ID)
		return subject{task: sleep(t, b, run)}
	case arbortype.StatusCompleting:
		run := b.start(t, root.ID)
		child := b.child(t, run.ID, "child")
		held, err := b.engine.Complete(b.ctx, run.ID, run.Token, js(`"held"`))
		require.NoError(t, err)
		return subject{task: held, child: child}
	case arbortype.StatusCompleted:
		run := b.start(t, root.ID)
		done, err := b.engine.Complete(b.ctx, run.ID, run.Token, nil)
		require.NoError(t, err)
		return subject{task: done}
	case arbortype.StatusFailed:
		run := b.start(t, root.ID)
		failed, err := b.engine.Fail(b.ctx, run.ID, run.Token, arbortype.TaskError{Message: "boom"})
		require.NoError(t, err)
		return subject{task: failed}
	case arbortype.StatusCancelled:
		c, err := b.engine.Cancel(b.ctx, root.ID, nil)
		require.NoError(t, err)
		return subject{task: c}
	case arbortype.StatusAborted:
		b.start(t, root.ID)
		_, err := b.engine.Abort(b.ctx, root.ID)
		require.NoError(t, err)
		return subject{task: b.get(t, root.ID)}
	case arbortype.StatusOrphaned:
		_, err := b.engine.Abort(b.ctx, root.ID)
		require.NoError(t, err)
		return subject{task: b.get(t, root.ID)}
	}
	t.Fatalf("cannot reach %s", status)
	return subject{}
}

// sleep parks a running task in sleeping for an hour.
func sleep(t *testing.T, b *bundle, run arbortype.Task) arbortype.Task {
	t.Helper()
	slept, err := b.engine.SleepUntil(b.ctx, run.ID, run.Token, time.Now().Add(time.Hour), "napping", nil)
	require.NoError(t, err)
	return slept
}

// apply moves s along edge through the operation that owns the edge.
func apply(t *testing.T, b *bundle, s subject, e fsm.Edge) {
	t.Helper()
	id, token := s.task.ID, s.task.Token
	var err error
	switch {
	case e.Event == fsm.Start:
		_, err = b.engine.Start(b.ctx, id)
	case e.Event == fsm.Checkpoint:
		_, err = b.engine.Checkpoint(b.ctx, id, token, "p2", js(`{"step": 2}`))
	case e.Event == fsm.Wait:
		child := b.child(t, id, "child")
		_, err = b.engine.WaitForChildren(b.ctx, id, token, core.WaitParams{ChildIDs: []int64{child.ID}, Policy: arbortype.FailFast})
	case e.Event == fsm.Sleep:
		sleep(t, b, s.task)
	case e.Event == fsm.Retry:
		_, err = b.engine.Fail(b.ctx, id, token, arbortype.TaskError{Message: "try again"})
	case e.Event == fsm.Hold:
		b.child(t, id, "child")
		_, err = b.engine.Complete(b.ctx, id, token, js(`"held"`))
	case e.Event == fsm.Complete && e.From == arbortype.StatusCompleting:
		run := b.start(t, s.child.ID)
		_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	case e.Event == fsm.Complete:
		_, err = b.engine.Complete(b.ctx, id, token, js(`"ok"`))
	case e.Event == fsm.Fail && e.From == arbortype.StatusPending:
		_, err = b.engine.ForceFail(b.ctx, id, arbortype.TaskError{Code: arbortype.CodeRestartLimitExceeded, Message: "past its limit"})
	case e.Event == fsm.Fail:
		_, err = b.engine.Fail(b.ctx, id, token, arbortype.TaskError{Message: "boom"})
	case e.Event == fsm.Cancel:
		_, err = b.engine.Cancel(b.ctx, id, js(`"stopped"`))
	case e.Event == fsm.Abort, e.Event == fsm.Orphan:
		_, err = b.engine.Abort(b.ctx, id)
	case e.Event == fsm.Recover:
		_, err = b.engine.Recover(b.ctx, id)
	case e.Event == fsm.Wake && e.From == arbortype.StatusWaiting:
		run := b.start(t, s.child.ID)
		_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
	case e.Event == fsm.Wake:
		_, err = b.engine.WakeNow(b.ctx, id)
	case e.Event == fsm.Await:
		_, err = b.engine.AwaitEvent(b.ctx, id, token, core.AwaitParams{Name: "approval", Timeout: time.Hour})
	case e.Event == fsm.Rerun:
		var rerun arbortype.Task
		rerun, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (arbortype.Task, error) { return b.engine.C.Rerun(b.ctx, tx, s.failed.ID) })
		if err == nil {
			require.Equal(t, []int64{s.child.ID, rerun.ID}, b.get(t, id).WaitIDs, "the rerun in the failed child's place")
		}
	case e.Event == fsm.Expire:
		var expired bool
		expired, err = b.engine.Expire(b.ctx, id)
		require.True(t, expired, "expired past its deadline")
	default:
		t.Fatalf("no operation for %v", e)
	}
	require.NoError(t, err, "%s --%s--> %s", e.From, e.Event, e.To)
}

// TestEveryAllowedEdge walks every edge of docs/design.md §2 through the engine.
func TestEveryAllowedEdge(t *testing.T) {
	t.Parallel()
	for _, e := range fsm.Edges() {
		t.Run(fmt.Sprintf("%s_%s_%s", e.From, e.Event, e.To), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if e.Event == fsm.Retry {
				b.retries = 1 // a failure with a retry left sleeps until its backoff
			}
			if e.Event == fsm.Expire {
				b.deadline = time.Now().Add(-time.Minute) // due already
			}
			s := reach(t, b, e.From, e.Event == fsm.Abort && e.From == arbortype.StatusPending)
			require.Equal(t, e.From, s.task.Status)
			apply(t, b, s, e)
			got := b.get(t, s.task.ID)
			require.Equal(t, e.To, got.Status)
			if e.Event == fsm.Checkpoint {
				require.Equal(t, "p2", got.Phase)
				require.JSONEq(t, `{"step": 2}`, string(got.State))
			}
			// Leave nothing live behind for the invariant check.
			if _, err := b.engine.AbortConversation(b.ctx, b.conv); err != nil {
				require.NoError(t, err)
			}
		})
	}
}

// TestEveryForbiddenPairIsRefused tries every (from, event) pair the table
// does not have, through the operation that owns the event: the engine
// refuses it with an arbor error and writes nothing, and, separately, the
// database refuses a raw UPDATE to the event's status. Two events have no
// operation that could be aimed at a wrong status: recovery requeues only
// running tasks (it moves nothing else), and orphan is chosen by Abort
// itself for a task that never ran (any other live task is aborted).
func TestEveryForbiddenPairIsRefused(t *testing.T) {
	t.Parallel()
	dst := map[fsm.Event]arbortype.Status{}
	for _, e := range fsm.Edges() {
		dst[e.Event] = e.To
	}
	for _, from := range arbortype.Statuses {
		for _, event := range fsm.Events {
			if _, err := fsm.Transition(from, event); err == nil {
				continue
			}
			t.Run(fmt.Sprintf("%s_%s", from, event), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				s := reach(t, b, from, false)
				before := b.snapshot(t)

				if event == fsm.Rerun {
					// No operation aims the rerun edge at a task: Rerun takes it
					// for an owner only when that owner waits on the rerun's
					// source (TestEveryAllowedEdge); a rerun under an owner in
					// any other status leaves the owner as it is
					// (TestRerunOfAFailedChildUnderAWaitingParent, in tasks). The
					// database's side: TestDatabaseRefusesEveryForbiddenStatusChange.
					return
				}
				err := applyForbidden(t, b, s, event)
				switch {
				case event == fsm.Recover, event == fsm.Expire:
					// Recovery requeues only running tasks; expiry passes over
					// a settled task (the runners' sweep may meet one).
					require.NoError(t, err, "%s of a %s task moves nothing", event, from)
					require.Equal(t, before, b.snapshot(t), "nothing written")
				case event == fsm.Orphan && from.Live():
					require.NoError(t, err)
					require.Equal(t, arbortype.StatusAborted, b.get(t, s.task.ID).Status, "Abort takes the abort edge for a task that ran")
					return // the database side: TestDatabaseRefusesEveryForbiddenStatusChange
				default:
					require.Error(t, err, "engine refuses %s from %s", event, from)
					require.True(t, errors.Is(err, arbortype.ErrInvalidTransition) || errors.Is(err, arbortype.ErrNotRunning) ||
						errors.Is(err, arbortype.ErrAborted) || errors.Is(err, arbortype.ErrAlreadyRunning) ||
						errors.Is(err, arbortype.ErrNotSleeping), "an arbor error: %v", err)
					var te *fsm.TransitionError
					if errors.As(err, &te) {
						require.Equal(t, from, te.From)
					}
					require.Equal(t, before, b.snapshot(t), "nothing written")
				}

				// The database sees statuses, not events: it refuses the
				// status change unless another event allows the same pair
				// (pending --checkpoint--> running is refused by the engine,
				// but pending -> running is the start edge). Every status
				// pair is covered by TestDatabaseRefusesEveryForbiddenStatusChange.
				to := dst[event]
				if to == from || slices.Contains(fsm.StatusChanges(), [2]arbortype.Status{from, to}) {
					return
				}
				_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET status = $2 WHERE id = $1`, s.task.ID, string(to))
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "database refuses %s -> %s: %v", from, to, err)
				require.Contains(t, []string{guardrules.SQLStateInvalidTransition, guardrules.SQLStateSettled}, pgErr.Code)
				require.Equal(t, before, b.snapshot(t), "nothing written")
				if _, err := b.engine.AbortConversation(b.ctx, b.conv); err != nil {
					require.NoError(t, err)
				}
			})
		}
	}
}

// applyForbidden aims the operation that owns event at s, whatever its
// status, with the task's own token (0 when it is not running).
func applyForbidden(t *testing.T, b *bundle, s subject, event fsm.Event) error {
	t.Helper()
	id, token := s.task.ID, s.task.Token
	var err error
	switch event {
	case fsm.Start:
		_, err = b.engine.Start(b.ctx, id)
	case fsm.Checkpoint:
		_, err = b.engine.Checkpoint(b.ctx, id, token, "p", nil)
	case fsm.Wait:
		_, err = b.engine.WaitForChildren(b.ctx, id, token, core.WaitParams{Policy: arbortype.AllSettled})
	case fsm.Sleep:
		_, err = b.engine.SleepUntil(b.ctx, id, token, time.Now().Add(time.Hour), "p", nil)
	case fsm.Retry, fsm.Fail:
		_, err = b.engine.Fail(b.ctx, id, token, arbortype.TaskError{Message: "boom"})
	case fsm.Hold, fsm.Complete:
		_, err = b.engine.Complete(b.ctx, id, token, nil)
	case fsm.Cancel:
		_, err = b.engine.Cancel(b.ctx, id, nil)
	case fsm.Abort, fsm.Orphan:
		_, err = b.engine.Abort(b.ctx, id)
	case fsm.Recover:
		_, err = b.engine.Recover(b.ctx, id)
	case fsm.Wake:
		_, err = b.engine.WakeNow(b.ctx, id)
	case fsm.Await:
		_, err = b.engine.AwaitEvent(b.ctx, id, token, core.AwaitParams{Name: "approval"})
	case fsm.Expire:
		_, err = b.engine.Expire(b.ctx, id)
	default:
		t.Fatalf("no operation for %s", event)
	}
	return err
}

// TestDatabaseRefusesEveryForbiddenStatusChange tries a raw UPDATE for every
// (from, to) pair of statuses that no edge allows.
func TestDatabaseRefusesEveryForbiddenStatusChange(t *testing.T) {
	t.Parallel()
	for _, from := range arbortype.Statuses {
		t.Run(string(from), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			s := reach(t, b, from, false)
			for _, to := range arbortype.Statuses {
				if to == from || slices.Contains(fsm.StatusChanges(), [2]arbortype.Status{from, to}) {
					continue
				}
				before := b.snapshot(t)
				_, err := b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET status = $2 WHERE id = $1`, s.task.ID, string(to))
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "database refuses %s -> %s: %v", from, to, err)
				require.Contains(t, []string{guardrules.SQLStateInvalidTransition, guardrules.SQLStateSettled}, pgErr.Code)
				require.Equal(t, before, b.snapshot(t), "nothing written")
			}
			if _, err := b.engine.AbortConversation(b.ctx, b.conv); err != nil {
				require.NoError(t, err)
			}
		})
	}
}

func TestDatabaseGuardsIdentityAndSettledRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := reach(t, b, arbortype.StatusCompleted, false).task
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET phase = 'rewritten' WHERE id = $1`, done.ID)
	requireSQLState(t, err, guardrules.SQLStateSettled)

	live := b.root(t, "live")
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.tasks SET kind = 'other' WHERE id = $1`, live.ID)
	requireSQLState(t, err, guardrules.SQLStateImmutable)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO `+b.schema+`.tasks (conversation_id, kind, status) VALUES ($1, 'x', 'running')`, b.conv)
	requireSQLState(t, err, guardrules.SQLStateInvalidInsert)

	other := testdb.Conversation(t)
	_, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: other, Kind: "x"})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO `+b.schema+`.tasks (conversation_id, owner_task_id, kind) VALUES ($1, $2, 'x')`, other, live.ID)
	require.Error(t, err, "an owner in another conversation is refused by the foreign key")
	_, err = b.engine.AbortConversation(b.ctx, other)
	require.NoError(t, err)
	_, err = b.engine.Abort(b.ctx, live.ID)
	require.NoError(t, err)
}

func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}
