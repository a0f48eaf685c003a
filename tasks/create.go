package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// RestartLimitNone is the CreateParams.RestartLimit of a task that fails
// with restart_limit_exceeded at its first recovery.
const RestartLimitNone = -1

// CreateParams describe a new task.
type CreateParams struct {
	// ConversationID groups tasks; its row is created on first use. Required,
	// at most 200 bytes of UTF-8 text.
	ConversationID string
	// OwnerID is the task creating this one; 0 creates a root task (a turn).
	// The owner must be live, in the same conversation, not completing and
	// not being aborted. (A handler creates its children with
	// machine.Run.Spawn, which also fences the create by its run.)
	OwnerID int64
	// Kind names the handler that runs the task. Required, at most 200 bytes.
	Kind string
	// Input is the task's JSON input; empty for none.
	Input json.RawMessage
	// Background makes a child that neither holds its owner in completing
	// nor is reached by its owner's abort. Only for children.
	Background bool
	// AbandonOnRestart makes a task that is never re-run after a crash (a
	// non-idempotent call): on recovery it is settled cancelled instead.
	AbandonOnRestart bool
	// RestartLimit is how many recoveries the task survives; 0 means
	// Config.RestartLimit, RestartLimitNone means none.
	RestartLimit int
	// MaxRetries is how many times a failed run is retried (a handler's
	// error not marked machine.NonRetryable). 0 means no retry.
	MaxRetries int
	// RetryBackoffBase and RetryBackoffCap are the task's backoff between
	// retries (see Config.RetryBackoffBase); 0 means the engine's. They are
	// stored with the task, so every node retries it alike.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// IdempotencyKey, unique per conversation, makes a repeated Create
	// return the task the first one created (created=false). At most 200
	// bytes; empty for none; keys starting with "arbor:" are arbor's own.
	IdempotencyKey string
}

func (p CreateParams) core() core.CreateParams {
	return core.CreateParams{
		ConversationID: p.ConversationID, OwnerID: p.OwnerID, Kind: p.Kind, Input: p.Input,
		Background: p.Background, AbandonOnRestart: p.AbandonOnRestart, RestartLimit: p.RestartLimit,
		MaxRetries: p.MaxRetries, RetryBackoffBase: p.RetryBackoffBase, RetryBackoffCap: p.RetryBackoffCap,
		IdempotencyKey: p.IdempotencyKey,
	}
}

// Create creates a pending task in a transaction of its own, and the
// conversation on first use. created is false when IdempotencyKey matched
// an existing task, which is returned instead (a key reused for another kind
// or owner is ErrIdempotencyConflict). Bad input is refused before anything
// is written: ErrInvalidArgument, ErrInvalidJSON, ErrPayloadTooLarge, an
// unknown owner ErrNotFound, an owner of another conversation
// ErrForeignOwner, an owner that cannot take a child ErrOwnerNotLive.
//
// The machine holding the conversation hears of the new task at commit
// (NOTIFY) and runs it.
//
// A root task (no owner) takes one round trip: one statement, committed on
// its own. A task with an owner, and a root whose conversation is being
// created by another transaction at the same moment or whose idempotency
// key is taken, go through a transaction.
func (e *Engine) Create(ctx context.Context, p CreateParams) (task arbortype.Task, created bool, err error) {
	if p.OwnerID == 0 && !strings.HasPrefix(p.IdempotencyKey, "arbor:") {
		t, ok, err := core.CreateRoot(ctx, e.core, p.core())
		if err != nil || ok {
			return t, ok, err
		}
	}
	r, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (createResult, error) { return e.create(ctx, tx, p) })
	return r.task, r.created, err
}

// CreateTx is Create inside the caller's transaction: the task exists only
// if that transaction commits, so it can commit together with the caller's
// own rows (the user's message and the turn that answers it, say).
func (e *Engine) CreateTx(ctx context.Context, tx pgx.Tx, p CreateParams) (task arbortype.Task, created bool, err error) {
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (createResult, error) { return e.create(ctx, tx, p) })
	return r.task, r.created, err
}

type createResult struct {
	task    arbortype.Task
	created bool
}

func (e *Engine) create(ctx context.Context, tx pgx.Tx, p CreateParams) (createResult, error) {
	if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
		return createResult{}, fmt.Errorf("create task: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w", p.IdempotencyKey, ErrInvalidArgument)
	}
	t, created, err := e.core.Create(ctx, tx, p.core())
	return createResult{t, created}, err
}

// CreateMany creates many tasks in one transaction of its own, at the cost
// of a few statements for the whole batch rather than a few per task: the
// way to create work in bulk (a backfill, a fan-out your application plans
// itself), as River's InsertMany is. Each task follows Create's rules (an
// idempotency key already used returns that task with created false; a key
// repeated within the batch is created once); an owner must exist before the
// batch. One refused task refuses the batch, naming its index, and nothing
// is written. At most 10,000 tasks; they come back in the order given.
func (e *Engine) CreateMany(ctx context.Context, ps []CreateParams) (tasks []arbortype.Task, created []bool, err error) {
	r, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (manyResult, error) { return e.createMany(ctx, tx, ps) })
	return r.tasks, r.created, err
}

// CreateManyTx is CreateMany inside the caller's transaction.
func (e *Engine) CreateManyTx(ctx context.Context, tx pgx.Tx, ps []CreateParams) (tasks []arbortype.Task, created []bool, err error) {
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (manyResult, error) { return e.createMany(ctx, tx, ps) })
	return r.tasks, r.created, err
}

type manyResult struct {
	tasks   []arbortype.Task
	created []bool
}

func (e *Engine) createMany(ctx context.Context, tx pgx.Tx, ps []CreateParams) (manyResult, error) {
	cps := make([]core.CreateParams, len(ps))
	for i, p := range ps {
		if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
			return manyResult{}, fmt.Errorf("create tasks: task %d of %d: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w", i, len(ps), p.IdempotencyKey, ErrInvalidArgument)
		}
		cps[i] = p.core()
	}
	ts, created, err := e.core.CreateMany(ctx, tx, cps)
	return manyResult{ts, created}, err
}
