package tasks

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// SteerEventDefault is the event name of a steered input.
const SteerEventDefault = "message"

// coreParams is p as the engine takes it, with the trace context of the
// create's context.
func coreParams(p arbortype.CreateParams, trace map[string]string) core.CreateParams {
	return core.CreateParams{CreateParams: p, Trace: trace}
}

// Create creates a task (pending, or started: below), and its
// conversation on first use. created is false when IdempotencyKey matched
// an existing task, which is returned instead (a key reused for another kind
// or owner is arbortype.ErrIdempotencyConflict). Bad input is refused before anything
// is written: arbortype.ErrInvalidArgument, arbortype.ErrInvalidJSON, arbortype.ErrPayloadTooLarge, an
// unknown owner arbortype.ErrNotFound, an owner of another conversation
// arbortype.ErrForeignOwner, an owner that cannot take a child arbortype.ErrOwnerNotLive.
//
// The machine holding the conversation hears of the new task at commit
// (NOTIFY) and runs it. The first task of a new conversation, created in a
// process whose machine.Runner runs its kind and has a worker free, is
// started by the create itself and returned running: that runner enters
// its handler once the statement has committed (docs/design.md §3.18).
//
// A root task (no owner) takes one round trip: one statement, committed on
// its own. A task with an owner, and a root whose conversation is being
// created by another transaction at the same moment or whose idempotency
// key is taken, go through a transaction.
func (e *Engine) Create(ctx context.Context, p arbortype.CreateParams) (task arbortype.Task, created bool, err error) {
	trace := e.core.Trace(ctx)
	if p.OwnerID == 0 && !strings.HasPrefix(p.IdempotencyKey, "arbor:") && e.policy(p) == arbortype.TurnQueue {
		t, ok, err := core.CreateRoot(ctx, e.core, coreParams(p, trace))
		if err != nil || ok {
			return t, ok, err
		}
	}
	r, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (createResult, error) { return e.create(ctx, tx, p, trace) })
	return r.task, r.created, err
}

// CreateTx is Create inside the caller's transaction: the task exists only
// if that transaction commits, so it can commit together with the caller's
// own rows (the user's message and the turn that answers it, say). It
// starts no task itself (the runner could not know when the transaction
// commits): the runner hears of it at the commit.
func (e *Engine) CreateTx(ctx context.Context, tx pgx.Tx, p arbortype.CreateParams) (task arbortype.Task, created bool, err error) {
	trace := e.core.Trace(ctx)
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (createResult, error) { return e.create(ctx, tx, p, trace) })
	return r.task, r.created, err
}

type createResult struct {
	task    arbortype.Task
	created bool
}

func (e *Engine) create(ctx context.Context, tx pgx.Tx, p arbortype.CreateParams, trace map[string]string) (createResult, error) {
	if strings.HasPrefix(p.SteerEvent, "arbor:") {
		return createResult{}, fmt.Errorf("create task: steer event %q: the prefix \"arbor:\" is arbor's own: %w", p.SteerEvent, arbortype.ErrInvalidArgument)
	}
	if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
		return createResult{}, fmt.Errorf("create task: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w", p.IdempotencyKey, arbortype.ErrInvalidArgument)
	}
	policy := e.policy(p)
	if !policy.Valid() {
		return createResult{}, fmt.Errorf("create task: turn policy %q: %w", policy, arbortype.ErrInvalidArgument)
	}
	if policy != arbortype.TurnQueue {
		if p.OwnerID != 0 {
			return createResult{}, fmt.Errorf("create task: turn policy %q: a turn policy is for root tasks: %w", policy, arbortype.ErrInvalidArgument)
		}
		r, done, err := e.busy(ctx, tx, p, policy, trace)
		if done || err != nil {
			return r, err
		}
	}
	cp := coreParams(p, trace)
	t, created, err := e.core.Create(ctx, tx, cp)
	if err == nil && created && cp.HasBudgets() {
		err = e.core.ApplyCreateBudgets(ctx, tx, []core.CreateParams{cp}, []arbortype.Task{t}, []bool{true})
	}
	return createResult{t, created}, err
}

// policy is the turn policy p is created under: its OnBusy, else its
// kind's configured policy, else arbortype.TurnQueue. A child's is arbortype.TurnQueue unless it
// names another (refused then).
func (e *Engine) policy(p arbortype.CreateParams) arbortype.TurnPolicy {
	policy := p.OnBusy
	if policy == arbortype.TurnDefault && p.OwnerID == 0 {
		policy = e.core.Cfg.TurnPolicies[p.Kind]
	}
	if policy == arbortype.TurnDefault {
		return arbortype.TurnQueue
	}
	return policy
}

// busy applies policy to a turn created while another root task of its
// conversation is live, under the conversation's row lock (so that N
// concurrent creates get exactly what the policy says): done says the
// create is answered (rejected, or steered into the live turn); otherwise
// the turn is created after it (the live turns aborted, for interrupt).
func (e *Engine) busy(ctx context.Context, tx pgx.Tx, p arbortype.CreateParams, policy arbortype.TurnPolicy, trace map[string]string) (createResult, bool, error) {
	live, err := e.core.LockLiveRoots(ctx, tx, p.ConversationID, p.Tenant)
	if err != nil || len(live) == 0 {
		return createResult{}, false, err
	}
	if p.IdempotencyKey != "" {
		// A repeat of the create that made a live turn returns it; a
		// repeated steer, whose key its message's own turn has, the turn it
		// was steered into, as the first one did.
		for _, t := range live {
			if t.IdempotencyKey != p.IdempotencyKey {
				continue
			}
			into, steered, err := e.core.SteeredInto(ctx, tx, p.ConversationID, t.ID)
			if err == nil && steered {
				t, err = e.core.Get(ctx, tx, into)
			}
			return createResult{task: t}, true, err
		}
	}
	switch policy {
	case arbortype.TurnReject:
		return createResult{}, true, fmt.Errorf("create task in conversation %q: turn %d (%s) is %s: %w",
			p.ConversationID, live[0].ID, live[0].Kind, live[0].Status, arbortype.ErrBusy)
	case arbortype.TurnInterrupt:
		for _, t := range live {
			if _, err := e.core.AbortWhy(ctx, tx, t.ID, "interrupted by a new turn"); err != nil {
				return createResult{}, true, err
			}
		}
		return createResult{}, false, nil
	case arbortype.TurnSteer:
		name := p.SteerEvent
		if name == "" {
			name = SteerEventDefault
		}
		// The message goes to the oldest live turn, and is a turn of its
		// own queued behind it, so that it is answered whether that turn
		// takes it or not (core.Engine.Steer).
		own, created, err := e.core.Steer(ctx, tx, live[0], coreParams(p, trace), name)
		if err != nil {
			return createResult{}, true, err
		}
		answer := live[0].ID
		if !created {
			// Its key named a task already: the repeat returns what the
			// first create returned.
			into, steered, err := e.core.SteeredInto(ctx, tx, p.ConversationID, own.ID)
			switch {
			case err != nil:
				return createResult{}, true, err
			case steered:
				answer = into
			default:
				return createResult{task: own}, true, nil
			}
		}
		cur, err := e.core.Get(ctx, tx, answer)
		return createResult{task: cur}, true, err
	}
	return createResult{}, false, nil
}

// CreateMany creates many tasks in one transaction of its own, at the cost
// of a few statements for the whole batch rather than a few per task: the
// way to create work in bulk (a backfill, a fan-out your application plans
// itself), as River's InsertMany is. Each task follows Create's rules (an
// idempotency key already used returns that task with created false; a key
// repeated within the batch is created once); an owner must exist before the
// batch. One refused task refuses the batch, naming its index, and nothing
// is written. At most 10,000 tasks; they come back in the order given. As
// Create does, it starts the first task of each new conversation when a
// machine.Runner of this process runs its kind and has a worker free for
// it; those come back running (docs/design.md §3.18).
func (e *Engine) CreateMany(ctx context.Context, ps []arbortype.CreateParams) (tasks []arbortype.Task, created []bool, err error) {
	trace := e.core.Trace(ctx)
	cps := make([]core.CreateParams, len(ps))
	for i, p := range ps {
		cps[i] = coreParams(p, trace)
	}
	// A runner of this process with workers free may have the transaction
	// start the first task of new conversations (docs/design.md §3.18).
	g, runs := e.core.Grant(cps)
	st := core.StartOf(g, runs)
	r, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (manyResult, error) { return e.createMany(ctx, tx, ps, trace, st) })
	if g == nil {
		return r.tasks, r.created, err
	}
	if core.IsGuardRefusal(err) {
		// The guard refused a start (nothing was written): a limit of a
		// task's kind or tenant committed between the statement's
		// snapshot and the guard's. The tasks are queued.
		g.Done(nil, err)
		r, err = core.Tx(ctx, e.core, func(tx pgx.Tx) (manyResult, error) { return e.createMany(ctx, tx, ps, trace, core.Start{}) })
		return r.tasks, r.created, err
	}
	g.Done(core.Started(r.tasks), err)
	return r.tasks, r.created, err
}

// CreateManyTx is CreateMany inside the caller's transaction; it starts none of
// its tasks (the runner could not know when the transaction commits).
func (e *Engine) CreateManyTx(ctx context.Context, tx pgx.Tx, ps []arbortype.CreateParams) (tasks []arbortype.Task, created []bool, err error) {
	trace := e.core.Trace(ctx)
	r, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (manyResult, error) { return e.createMany(ctx, tx, ps, trace, core.Start{}) })
	return r.tasks, r.created, err
}

type manyResult struct {
	tasks   []arbortype.Task
	created []bool
}

func (e *Engine) createMany(ctx context.Context, tx pgx.Tx, ps []arbortype.CreateParams, trace map[string]string, st core.Start) (manyResult, error) {
	cps := make([]core.CreateParams, len(ps))
	for i, p := range ps {
		if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
			return manyResult{}, fmt.Errorf("create tasks: task %d of %d: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w", i, len(ps), p.IdempotencyKey, arbortype.ErrInvalidArgument)
		}
		cps[i] = coreParams(p, trace)
	}
	ts, created, err := e.core.CreateManyStarting(ctx, tx, cps, st)
	if err == nil {
		err = e.core.ApplyCreateBudgets(ctx, tx, cps, ts, created)
	}
	return manyResult{ts, created}, err
}
