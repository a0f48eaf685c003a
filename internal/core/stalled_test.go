package core_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/tasks"
)

// TestStalledTransactionFreesTheConversation: a holder stopped in the
// middle of one of the engine's transactions (a paused or frozen process)
// must not keep the conversation row it locked, or no take-over could ever
// lock it (a take-over skips locked rows) for as long as the process stays
// stopped. Once the transaction sat idle for Config.IdleInTransaction, the
// server ends its session and another holder takes the conversation; the
// stalled transaction, when its process goes on, finds its session gone
// and runs again as a whole, like after any lost connection.
func TestStalledTransactionFreesTheConversation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.root(t, "turn")
	stalling := enginetest.New(t, b.pool, &tasks.Config{Schema: b.schema, IdleInTransaction: 200 * time.Millisecond})
	locked, resume := make(chan struct{}), make(chan struct{})
	goOn := sync.OnceFunc(func() { close(resume) })
	t.Cleanup(goOn) // a failing test lets the stalled transaction end too
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := core.Tx(b.ctx, stalling.C, func(tx pgx.Tx) (struct{}, error) {
			if _, err := stalling.C.Store.LockConversation(b.ctx, tx, b.conv); err != nil {
				return struct{}{}, err
			}
			once.Do(func() { close(locked) })
			<-resume // the process is stopped here
			_, err := stalling.C.Store.GetConversation(b.ctx, tx, b.conv)
			return struct{}{}, err
		})
		done <- err
	}()
	<-locked
	require.Eventually(t, func() bool {
		_, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (core.Lease, error) {
			holder, _, err := b.engine.C.NewHolder(b.ctx, tx, "other", time.Minute)
			if err != nil {
				return core.Lease{}, err
			}
			l, _, err := b.engine.C.TakeLease(b.ctx, tx, b.conv, "other", holder)
			return l, err
		})
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "another holder takes the conversation the stalled transaction had locked")
	goOn()
	require.NoError(t, <-done, "the stalled transaction runs again when its process goes on")

	_, err := tasks.New(b.ctx, b.pool, &tasks.Config{Schema: b.schema, IdleInTransaction: -time.Second})
	require.ErrorContains(t, err, "Config.IdleInTransaction")
}
