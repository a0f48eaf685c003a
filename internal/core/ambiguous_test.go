package core_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// TestAmbiguousCommitIsNotRunAgain: a connection lost while COMMIT is in
// flight leaves the outcome unknown. Tx must say so (ErrAmbiguous) and must
// not run the transaction again: had it committed, running it again would
// apply it twice — a claim would start tasks nobody runs, a create without
// a key would make a twin. The test holds COMMIT in flight with a deferred
// trigger that sleeps, and terminates the backend meanwhile.
func TestAmbiguousCommitIsNotRunAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	table := pgx.Identifier{schema, "slow_commit"}.Sanitize()
	slow := pgx.Identifier{schema, "slow"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (try int);
		CREATE FUNCTION `+slow+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.try = 1 THEN PERFORM pg_sleep(60); END IF; RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON `+table+` DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION `+slow+`()`)
	require.NoError(t, err)

	var tries atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := core.Tx(ctx, e.C, func(tx pgx.Tx) (struct{}, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, tries.Add(1))
			return struct{}{}, err
		})
		done <- err
	}()
	var pid int32
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query ILIKE 'commit%'
			AND datname = current_database() AND pid <> pg_backend_pid()`).Scan(&pid) == nil
	}, 30*time.Second, 10*time.Millisecond, "COMMIT is in flight")
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)

	require.ErrorIs(t, <-done, arbortype.ErrAmbiguous)
	require.EqualValues(t, 1, tries.Load(), "the transaction ran once")
}

// TestNoConnectionIsNotAmbiguous: an operation whose context ends while
// it waits for a connection of an exhausted pool sent nothing. It is the
// context's error — not ErrAmbiguous, which would have the caller read
// back a write that cannot have happened, nor a fault retried until
// ErrUnavailable — and nothing is written: the one-statement root Create
// (Write), a Create in a transaction (Tx: a turn with a budget) and a read.
func TestNoConnectionIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	other, schema := testdb.Fresh(t)
	pool := testdb.SmallPool(t, 1)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	conv := testdb.Conversation(t)

	ops := []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{"a one-statement create", func(ctx context.Context) error {
			_, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
			return err
		}},
		{"a create in a transaction", func(ctx context.Context) error {
			_, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn",
				Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 10}}})
			return err
		}},
		{"a read", func(ctx context.Context) error { _, err := e.ConversationTasks(ctx, conv); return err }},
	}
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	for _, op := range ops {
		for _, c := range []struct {
			name string
			ctx  func() (context.Context, context.CancelFunc)
			want error
		}{
			{"a deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 20*time.Millisecond) }, context.DeadlineExceeded},
			{"a cancel", func() (context.Context, context.CancelFunc) {
				cctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(20*time.Millisecond, cancel)
				return cctx, cancel
			}, context.Canceled},
		} {
			what := op.name + ", " + c.name
			cctx, cancel := c.ctx()
			waited := pool.Stat().CanceledAcquireCount()
			err := op.op(cctx)
			cancel()
			require.ErrorIs(t, err, c.want, what)
			require.NotErrorIs(t, err, arbortype.ErrAmbiguous, what)
			require.NotErrorIs(t, err, arbortype.ErrUnavailable, what)
			require.Greater(t, pool.Stat().CanceledAcquireCount(), waited, "%s: it ended waiting for a connection", what)
		}
	}
	held.Release()

	var n int
	require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "tasks"}.Sanitize()+` WHERE conversation_id = $1`, conv).Scan(&n))
	require.Zero(t, n, "nothing was written")
}
