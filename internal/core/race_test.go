package core_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
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
	engine  *enginetest.Engine // on a pool whose connections carry appName
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
	return &racer{t: t, b: b, engine: enginetest.New(t, pool, &tasks.Config{Schema: b.schema}), appName: appName}
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

// holdTask locks a task row from another transaction, as a concurrent
// self-only write (a start, a checkpoint) would.
func (r *racer) holdTask(id int64) {
	tx, err := r.b.pool.Begin(r.b.ctx)
	require.NoError(r.t, err)
	_, err = tx.Exec(r.b.ctx, `SELECT 1 FROM `+r.b.schema+`.tasks WHERE id = $1 FOR NO KEY UPDATE`, id)
	require.NoError(r.t, err)
	r.holder = tx
}

// queue starts op and returns once it is blocked on a lock.
func (r *racer) queue(op func(e *enginetest.Engine) error) {
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
	for _, policy := range []arbortype.WaitPolicy{arbortype.AllSettled, arbortype.FailFast} {
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

				var res core.WaitResult
				wait := func(e *enginetest.Engine) (err error) {
					res, err = e.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{done.ID, last.ID}, Policy: policy})
					return err
				}
				settle := func(e *enginetest.Engine) error {
					if policy == arbortype.FailFast {
						_, err := e.Fail(b.ctx, last.ID, last.Token, arbortype.TaskError{Message: "no"})
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
				// Either way the parent ends pending, woken: by its own wait
				// when the child settled first, by the child's settle when
				// the wait parked first. No lost wake-up, and no run that
				// goes on past its wait.
				require.Equal(t, childFirst, res.Woken, "the wait saw the settled child and woke the task at once")
				require.Equal(t, arbortype.StatusPending, got.Status, "the parent is woken either way")
				require.Equal(t, []int64{done.ID, last.ID}, got.WaitIDs, "the wait is recorded for the re-entry")
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
			abort := func(e *enginetest.Engine) error { _, err := e.Abort(b.ctx, owner.ID); return err }
			complete := func(e *enginetest.Engine) error {
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
				require.Equal(t, arbortype.StatusCompleted, b.get(t, child.ID).Status)
			} else {
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], arbortype.ErrAborted, "the child's runner learns of the abort; nothing written")
				require.Equal(t, arbortype.StatusAborted, b.get(t, child.ID).Status)
			}
			require.Equal(t, arbortype.StatusAborted, b.get(t, owner.ID).Status)
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
			var grandchild arbortype.Task
			spawn := func(e *enginetest.Engine) (err error) {
				grandchild, _, err = e.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: child.ID, Kind: "browse"})
				return err
			}
			abort := func(e *enginetest.Engine) error { _, err := e.Abort(b.ctx, root.ID); return err }
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
				require.Equal(t, arbortype.StatusOrphaned, b.get(t, grandchild.ID).Status, "the abort reached the new grandchild")
			} else {
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], arbortype.ErrOwnerNotLive, "no grandchild escapes the abort")
				all, err := b.engine.ConversationTasks(b.ctx, b.conv)
				require.NoError(t, err)
				require.Len(t, all, 2)
			}
			require.Equal(t, arbortype.StatusAborted, b.get(t, child.ID).Status)
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
	res, err := b.engine.WaitForChildren(b.ctx, parent.ID, parent.Token, core.WaitParams{ChildIDs: []int64{c1.ID, c2.ID, c3.ID}, Policy: arbortype.FailFast})
	require.NoError(t, err)
	require.False(t, res.Woken)

	r.hold()
	r.queue(func(e *enginetest.Engine) error {
		_, err := e.Fail(b.ctx, c1.ID, c1.Token, arbortype.TaskError{Message: "first"})
		return err
	})
	r.queue(func(e *enginetest.Engine) error {
		_, err := e.Fail(b.ctx, c2.ID, c2.Token, arbortype.TaskError{Message: "second"})
		return err
	})
	errs := r.release()
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], arbortype.ErrAborted, "the second failure found its task already aborted by fail_fast")

	got, err := b.engine.GetMany(b.ctx, []int64{parent.ID, c1.ID, c2.ID, c3.ID})
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusPending, got[0].Status, "the owner was woken")
	require.Equal(t, arbortype.StatusFailed, got[1].Status)
	require.Equal(t, arbortype.StatusAborted, got[2].Status)
	require.Equal(t, arbortype.StatusAborted, got[3].Status)
	require.Less(t, got[1].SettleSeq, got[2].SettleSeq, "siblings aborted after the failure that tripped fail_fast")
	// The owner was woken once: it is pending and a second wake would have
	// been refused by the database (pending -> pending is no edge).
	rerun := b.start(t, parent.ID)
	require.Equal(t, 0, rerun.Attempt)
	_, err = b.engine.Complete(b.ctx, rerun.ID, rerun.Token, nil)
	require.NoError(t, err)
}
