// Package enginetest gives arbor's tests every engine operation in pool
// form, as the engine ran them before the handler's operations moved onto
// machine.Run: the user's tasks.Engine plus Start, Claim, Checkpoint,
// Complete, Fail, Wait, Sleep and the rest, each in a transaction of its
// own over internal/core. Starts and claims run under a lease of the test's
// own on the conversation ("test"), taken on first use and kept, as a
// runner's would be. Only tests import it.
package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/tasks"
)

// Engine is the user's Engine plus the operations a run makes
// (package machine's Run), in pool form, over the engine's own functions:
// the tests drive every operation of the engine directly. Starts and claims
// run under a lease of the test's own on the conversation (taken on first
// use), as a Runner's would.
type Engine struct {
	*tasks.Engine
	// C is the engine behind it.
	C *core.Engine
}

// leases are the tests' leases, by schema and conversation, shared by every
// Engine (a test may run two engines on one conversation).
var leases struct {
	sync.Mutex
	m map[[2]string]core.Lease
}

// Wrap returns the Engine of engine.
func Wrap(engine *tasks.Engine) *Engine {
	return &Engine{Engine: engine, C: core.Of(engine)}
}

// New returns an Engine on pool with cfg.
func New(t testing.TB, pool *pgxpool.Pool, cfg *tasks.Config) *Engine {
	t.Helper()
	engine, err := tasks.New(context.Background(), pool, cfg)
	require.NoError(t, err)
	return Wrap(engine)
}

func tx[T any](ctx context.Context, e *Engine, fn func(tx pgx.Tx) (T, error)) (T, error) {
	return core.Tx(ctx, e.C, fn)
}

// Lease returns the test's lease on conv, taking it (and recovering the
// conversation) on first use: conv must exist, and nobody else may hold it.
func (e *Engine) Lease(ctx context.Context, conv string) (core.Lease, error) {
	leases.Lock()
	defer leases.Unlock()
	key := [2]string{e.C.Cfg.Schema, conv}
	if l, ok := leases.m[key]; ok {
		return l, nil
	}
	l, err := tx(ctx, e, func(tx pgx.Tx) (core.Lease, error) {
		holder, _, err := e.C.NewHolder(ctx, tx, "test", time.Hour)
		if err != nil {
			return core.Lease{}, err
		}
		l, taken, err := e.C.TakeLease(ctx, tx, conv, "test", holder)
		if err != nil {
			return l, err
		}
		_, err = recovery.OnOpen(ctx, e.C, tx, conv, taken.Counted())
		return l, err
	})
	if err == nil {
		if leases.m == nil {
			leases.m = map[[2]string]core.Lease{}
		}
		leases.m[key] = l
	}
	return l, err
}

func (e *Engine) conversationOf(ctx context.Context, taskID int64) (string, error) {
	t, err := e.Get(ctx, taskID)
	return t.ConversationID, err
}

// Start starts a pending task under the test's lease.
func (e *Engine) Start(ctx context.Context, taskID int64) (arbortype.Task, error) {
	conv, err := e.conversationOf(ctx, taskID)
	if err != nil {
		return arbortype.Task{}, err
	}
	l, err := e.Lease(ctx, conv)
	if err != nil {
		return arbortype.Task{}, err
	}
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.Start(ctx, tx, l, taskID) })
}

// Claim claims up to limit pending tasks of conv under the test's lease.
func (e *Engine) Claim(ctx context.Context, conv string, limit int) ([]arbortype.Task, error) {
	l, err := e.Lease(ctx, conv)
	if err != nil {
		return nil, err
	}
	return tx(ctx, e, func(tx pgx.Tx) ([]arbortype.Task, error) {
		return e.C.Claim(ctx, tx, l, core.ClaimParams{Limit: limit})
	})
}

func (e *Engine) Checkpoint(ctx context.Context, taskID, token int64, phase string, state json.RawMessage) (arbortype.Task, error) {
	conv, err := e.conversationOf(ctx, taskID)
	if err != nil {
		return arbortype.Task{}, err
	}
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) {
		return e.C.Checkpoint(ctx, tx, conv, taskID, token, phase, state)
	})
}

func (e *Engine) Heartbeat(ctx context.Context, taskID, token int64) (arbortype.Task, error) {
	conv, err := e.conversationOf(ctx, taskID)
	if err != nil {
		return arbortype.Task{}, err
	}
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.Heartbeat(ctx, tx, conv, taskID, token) })
}

func (e *Engine) Complete(ctx context.Context, taskID, token int64, result json.RawMessage) (arbortype.Task, error) {
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.Complete(ctx, tx, taskID, token, result) })
}

func (e *Engine) CompleteTx(ctx context.Context, ptx pgx.Tx, taskID, token int64, result json.RawMessage) (arbortype.Task, error) {
	return core.Savepoint(ctx, ptx, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.Complete(ctx, tx, taskID, token, result) })
}

func (e *Engine) Fail(ctx context.Context, taskID, token int64, taskErr arbortype.TaskError) (arbortype.Task, error) {
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.Fail(ctx, tx, taskID, &token, taskErr) })
}

// ForceFail is recovery's failure: no token, no retry.
func (e *Engine) ForceFail(ctx context.Context, taskID int64, taskErr arbortype.TaskError) (arbortype.Task, error) {
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) { return e.C.ForceFail(ctx, tx, taskID, taskErr) })
}

func (e *Engine) WaitForChildren(ctx context.Context, taskID, token int64, p core.WaitParams) (core.WaitResult, error) {
	return tx(ctx, e, func(tx pgx.Tx) (core.WaitResult, error) { return e.C.WaitForChildren(ctx, tx, taskID, token, p) })
}

func (e *Engine) SleepUntil(ctx context.Context, taskID, token int64, wakeAt time.Time, phase string, state json.RawMessage) (arbortype.Task, error) {
	return tx(ctx, e, func(tx pgx.Tx) (arbortype.Task, error) {
		return e.C.SleepUntil(ctx, tx, taskID, token, wakeAt, phase, state)
	})
}

func (e *Engine) SleepUntilTx(ctx context.Context, ptx pgx.Tx, taskID, token int64, wakeAt time.Time, phase string, state json.RawMessage) (arbortype.Task, error) {
	return core.Savepoint(ctx, ptx, func(tx pgx.Tx) (arbortype.Task, error) {
		return e.C.SleepUntil(ctx, tx, taskID, token, wakeAt, phase, state)
	})
}

func (e *Engine) WakeSleeping(ctx context.Context, taskID, sleepSeq int64) (bool, error) {
	return tx(ctx, e, func(tx pgx.Tx) (bool, error) { return e.C.WakeSleeping(ctx, tx, taskID, sleepSeq) })
}

// AwaitEvent is Run.AwaitEvent in pool form.
func (e *Engine) AwaitEvent(ctx context.Context, taskID, token int64, p core.AwaitParams) (core.AwaitResult, error) {
	return tx(ctx, e, func(tx pgx.Tx) (core.AwaitResult, error) { return e.C.AwaitEvent(ctx, tx, taskID, token, p) })
}

// Expire is the runners' expiry of a task past its deadline, in pool form.
func (e *Engine) Expire(ctx context.Context, taskID int64) (bool, error) {
	return tx(ctx, e, func(tx pgx.Tx) (bool, error) { return e.C.Expire(ctx, tx, taskID) })
}

// Recover is what a take-over does to a running task: back to pending with
// attempt + 1, in a transaction that holds the conversation (as a lease's
// recovery does).
func (e *Engine) Recover(ctx context.Context, taskID int64) ([]int64, error) {
	return tx(ctx, e, func(tx pgx.Tx) ([]int64, error) {
		if _, err := e.C.Store.LockConversationOfTask(ctx, tx, taskID); err != nil {
			return nil, err
		}
		return e.C.RequeueMany(ctx, tx, []int64{taskID}, true)
	})
}

// SleepViolations runs the checker over conv and returns the messages of its
// violations of invariant 5 (sleeps and wake jobs) and of the retry bound;
// none for a conversation that was never created.
func (e *Engine) SleepViolations(t testing.TB, ctx context.Context, conv string) []string {
	t.Helper()
	if _, err := e.Conversation(ctx, conv); errors.Is(err, arbortype.ErrNotFound) {
		return nil
	}
	vs, err := e.Check(ctx, conv)
	require.NoError(t, err)
	var out []string
	for _, v := range vs {
		if v.Invariant == 5 || strings.Contains(v.Message, "retried") {
			out = append(out, v.Message)
		}
	}
	return out
}

// ReleaseLease gives the test's lease on conv up (recovering what still
// runs under it), so that a runner can take the conversation.
func (e *Engine) ReleaseLease(ctx context.Context, conv string) error {
	leases.Lock()
	defer leases.Unlock()
	key := [2]string{e.C.Cfg.Schema, conv}
	l, ok := leases.m[key]
	if !ok {
		return nil
	}
	_, err := tx(ctx, e, func(tx pgx.Tx) (struct{}, error) {
		if err := e.C.LockLease(ctx, tx, l); err != nil {
			return struct{}{}, err
		}
		if _, err := recovery.RecoverRunning(ctx, e.C, tx, conv, false, nil); err != nil {
			return struct{}{}, err
		}
		_, err := e.C.ReleaseLease(ctx, tx, l)
		return struct{}{}, err
	})
	if err == nil {
		delete(leases.m, key)
	}
	return err
}
