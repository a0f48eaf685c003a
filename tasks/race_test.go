package tasks_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// racer drives operations that block on a row lock held by the test, in an
// order the test chooses: each operation starts only once the previous one
// is seen blocked in pg_stat_activity, and PostgreSQL grants a row lock to
// its waiters in the order they queued.
type racer struct {
	t       *testing.T
	b       *bundle
	engine  *tasks.Engine // on a pool whose connections carry appName
	appName string
	holder  pgx.Tx
	blocked int
	done    []chan error
}

func newRacer(t *testing.T, b *bundle) *racer {
	t.Helper()
	appName := testdb.Name("racer")
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	engine, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	return &racer{t: t, b: b, engine: engine, appName: appName}
}

// hold locks the conversation row from another transaction, as a concurrent
// multi-task operation would.
func (r *racer) hold() {
	tx, err := r.b.pool.Begin(r.b.ctx)
	require.NoError(r.t, err)
	_, err = tx.Exec(r.b.ctx, `SELECT 1 FROM `+r.b.schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE`, r.b.conv)
	require.NoError(r.t, err)
	r.holder = tx
}

// queue starts op and returns once it is blocked on a lock.
func (r *racer) queue(op func(e *tasks.Engine) error) {
	ch := make(chan error, 1)
	go func() { ch <- op(r.engine) }()
	r.done = append(r.done, ch)
	r.blocked++
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(r.t, r.b.pool.QueryRow(r.b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, r.appName).Scan(&n))
		if n >= r.blocked {
			return
		}
		select {
		case err := <-ch:
			r.t.Fatalf("operation %d finished without blocking: %v", len(r.done), err)
		default:
		}
		require.True(r.t, time.Now().Before(deadline), "operation %d never blocked", len(r.done))
		time.Sleep(2 * time.Millisecond)
	}
}

// release ends the holding transaction and returns each queued operation's
// error, in queue order.
func (r *racer) release() []error {
	require.NoError(r.t, r.holder.Rollback(r.b.ctx))
	errs := make([]error, len(r.done))
	for i, ch := range r.done {
		errs[i] = <-ch
	}
	return errs
}

func TestRaceChildSettlesWhileOwnerEntersWait(t *testing.T) {
	t.Parallel()
	for _, policy := range []tasks.WaitPolicy{tasks.AllSettled, tasks.FailFast} {
		for _, childFirst := range []bool{true, false} {
			name := string(policy) + map[bool]string{true: "_child_first", false: "_wait_first"}[childFirst]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				r := newRacer(t, b)
				parent := b.start(t, b.root(t, "turn").ID)
				done := b.start(t, b.child(t, parent.ID, "a").ID)
				last := b.start(t, b.child(t, parent.ID, "b").ID)
				_, err := b.engine.Complete(b.ctx, done.ID, done.Token, nil)
				require.NoError(t, err)

				var res tasks.WaitResult
				wait := func(e *tasks.Engine) (err error) {
					res, err = e.WaitForChildren(b.ctx, parent.ID, parent.Token, tasks.WaitParams{ChildIDs: []int64{done.ID, last.ID}, Policy: policy})
					return err
				}
				settle := func(e *tasks.Engine) error {
					if policy == tasks.FailFast {
						_, err := e.Fail(b.ctx, last.ID, last.Token, tasks.TaskError{Message: "no"})
						return err
					}
					_, err := e.Complete(b.ctx, last.ID, last.Token, nil)
					return err
				}
				r.hold()
				if childFirst {
					r.queue(settle)
					r.queue(wait)
				} else {
					r.queue(wait)
					r.queue(settle)
				}
				for _, err := range r.release() {
					require.NoError(t, err)
				}
				got := b.get(t, parent.ID)
				if childFirst {
					require.True(t, res.Satisfied, "the wait saw the settled child and did not park")
					require.Equal(t, fsm.Running, got.Status)
				} else {
					require.False(t, res.Satisfied, "the task parked")
					require.Equal(t, fsm.Pending, got.Status, "the child's settle woke the parked parent: no lost wake-up")
				}
				_, err = b.engine.AbortConversation(b.ctx, b.conv)
				require.NoError(t, err)
			})
		}
	}
}

func TestRaceAbortOwnerVsChildCompleting(t *testing.T) {
	t.Parallel()
	for _, childFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "child_first", false: "abort_first"}[childFirst], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := newRacer(t, b)
			owner := b.start(t, b.root(t, "turn").ID)
			child := b.start(t, b.child(t, owner.ID, "tool").ID)
			abort := func(e *tasks.Engine) error { _, err := e.Abort(b.ctx, owner.ID); return err }
			complete := func(e *tasks.Engine) error {
				_, err := e.Complete(b.ctx, child.ID, child.Token, js(`"done"`))
				return err
			}
			r.hold()
			if childFirst {
				r.queue(complete)
				r.queue(abort)
			} else {
				r.queue(abort)
				r.queue(complete)
			}
			errs := r.release()
			if childFirst {
				require.NoError(t, errs[0])
				require.NoError(t, errs[1])
				require.Equal(t, fsm.Completed, b.get(t, child.ID).Status)
			} else {
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], tasks.ErrAborted, "the child's runner learns of the abort; nothing written")
				require.Equal(t, fsm.Aborted, b.get(t, child.ID).Status)
			}
			require.Equal(t, fsm.Aborted, b.get(t, owner.ID).Status)
		})
	}
}

func TestRaceAbortVsChildSpawningGrandchild(t *testing.T) {
	t.Parallel()
	for _, spawnFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "spawn_first", false: "abort_first"}[spawnFirst], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := newRacer(t, b)
			root := b.start(t, b.root(t, "turn").ID)
			child := b.start(t, b.child(t, root.ID, "agent").ID)
			var grandchild tasks.Task
			spawn := func(e *tasks.Engine) (err error) {
				grandchild, _, err = e.Create(b.ctx, tasks.CreateParams{ConversationID: b.conv, OwnerID: child.ID, Kind: "browse"})
				return err
			}
			abort := func(e *tasks.Engine) error { _, err := e.Abort(b.ctx, root.ID); return err }
			r.hold()
			if spawnFirst {
				r.queue(spawn)
				r.queue(abort)
			} else {
				r.queue(abort)
				r.queue(spawn)
			}
			errs := r.release()
			if spawnFirst {
				require.NoError(t, errs[0])
				require.NoError(t, errs[1])
				require.Equal(t, fsm.Orphaned, b.get(t, grandchild.ID).Status, "the abort reached the new grandchild")
			} else {
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], tasks.ErrOwnerNotLive, "no grandchild escapes the abort")
				all, err := b.engine.ConversationTasks(b.ctx, b.conv)
				require.NoError(t, err)
				require.Len(t, all, 2)
			}
			require.Equal(t, fsm.Aborted, b.get(t, child.ID).Status)
		})
	}
}

func TestRaceFailFastTwoChildrenFailAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRacer(t, b)
	parent := b.start(t, b.root(t, "turn").ID)
	c1 := b.start(t, b.child(t, parent.ID, "a").ID)
	c2 := b.start(t, b.child(t, parent.ID, "b").ID)
	c3 := b.start(t, b.child(t, parent.ID, "c").ID)
	res, err := b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, tasks.WaitParams{ChildIDs: []int64{c1.ID, c2.ID, c3.ID}, Policy: tasks.FailFast})
	require.NoError(t, err)
	require.False(t, res.Satisfied)

	r.hold()
	r.queue(func(e *tasks.Engine) error {
		_, err := e.Fail(b.ctx, c1.ID, c1.Token, tasks.TaskError{Message: "first"})
		return err
	})
	r.queue(func(e *tasks.Engine) error {
		_, err := e.Fail(b.ctx, c2.ID, c2.Token, tasks.TaskError{Message: "second"})
		return err
	})
	errs := r.release()
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], tasks.ErrAborted, "the second failure found its task already aborted by fail_fast")

	got, err := b.engine.GetMany(b.ctx, []int64{parent.ID, c1.ID, c2.ID, c3.ID})
	require.NoError(t, err)
	require.Equal(t, fsm.Pending, got[0].Status, "the owner was woken")
	require.Equal(t, fsm.Failed, got[1].Status)
	require.Equal(t, fsm.Aborted, got[2].Status)
	require.Equal(t, fsm.Aborted, got[3].Status)
	require.Less(t, got[1].SettleSeq, got[2].SettleSeq, "siblings aborted after the failure that tripped fail_fast")
	// The owner was woken once: it is pending and a second wake would have
	// been refused by the database (pending -> pending is no edge).
	rerun := b.start(t, parent.ID)
	require.Equal(t, 0, rerun.Attempt)
	_, err = b.engine.Complete(b.ctx, rerun.ID, rerun.Token, nil)
	require.NoError(t, err)
}
