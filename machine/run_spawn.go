package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// SpawnParams describe a child a handler creates: the fields of
// arbortype.CreateParams a child may set (its conversation and owner are the
// run's; the turn policies and conversation budgets are for turns).
type SpawnParams struct {
	// Kind names the child's handler. Required.
	Kind string
	// Input is the child's JSON input; empty for none.
	Input json.RawMessage
	// Background makes a child that neither holds its owner in completing
	// nor is reached by its owner's abort (a summary written on the side).
	Background bool
	// AbandonOnRestart makes a child that is never re-run after a crash.
	AbandonOnRestart bool
	// RestartLimit is how many recoveries the child survives; 0 means the
	// engine's, arbortype.RestartLimitNone none.
	RestartLimit int
	// MaxRetries is how many times a failed run of the child is retried.
	MaxRetries int
	// RetryBackoffBase and RetryBackoffCap are the child's backoff between
	// retries; 0 means the engine's.
	RetryBackoffBase time.Duration
	RetryBackoffCap  time.Duration
	// Deadline, when not zero, is when the child, still live, fails with
	// code "deadline_exceeded" and its foreground subtree is aborted.
	Deadline time.Time
	// Budgets are set on the child (a sub-agent's own budget): its
	// subtree's spend is bounded by them as well as by every budget above
	// it. A spawn with budgets is written in a transaction of its own
	// rather than in the runner's batch.
	Budgets []arbortype.BudgetLimit
	// IdempotencyKey makes a spawn repeated after a crash return the child
	// the first run created (keys starting with "arbor:" are arbor's own).
	// Default: a key of the run's own, so that a spawn written again after a
	// lost connection, or repeated by this run's handler when the runner
	// calls it again after a transient fault, returns the same child; a
	// handler run again after a crash (a new run) spawns anew.
	IdempotencyKey string
	// Priority orders the child among its tenant's runnable work (see
	// arbortype.CreateParams.Priority); 0 means the kind's.
	Priority int
	// ConcurrencyKey names a key for a concurrency limit (a tool, a model
	// provider): see arbortype.CreateParams.ConcurrencyKey.
	ConcurrencyKey string
}

// Spawn creates a child of the task, fenced by the run's token: a run that
// lost its task cannot add children to it.
func (r *Run) Spawn(ctx context.Context, p SpawnParams) (arbortype.Task, error) {
	kids, err := r.SpawnMany(ctx, []SpawnParams{p})
	if err != nil {
		return arbortype.Task{}, err
	}
	return kids[0], nil
}

// SpawnMany creates several children of the task at once, in one statement
// (a turn's parallel tool calls), fenced like Spawn. They come back in the
// order given; one refused child refuses them all, and none is created.
func (r *Run) SpawnMany(ctx context.Context, ps []SpawnParams) ([]arbortype.Task, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	cps, err := r.spawnParams(ctx, ps)
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(cps, core.CreateParams.HasBudgets) {
		kids, err := write(ctx, r, func(ctx context.Context, tx pgx.Tx) ([]arbortype.Task, error) {
			kids, created, err := r.core.CreateMany(ctx, tx, cps)
			if err == nil {
				err = r.core.ApplyCreateBudgets(ctx, tx, cps, kids, created)
			}
			return kids, err
		})
		r.over(err)
		return kids, err
	}
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	res := r.sink.apply(ctx, r, core.Outcome{Kind: core.OutSpawn, TaskID: r.id, Token: r.token,
		ConversationID: r.conv, Spawns: cps})
	leave()
	r.over(res.Err)
	if res.Err != nil {
		return nil, res.Err
	}
	return res.Children, nil
}

// spawnParams turns a handler's spawns into the engine's creates, with keys
// of the run's own where the handler gave none.
func (r *Run) spawnParams(ctx context.Context, ps []SpawnParams) ([]core.CreateParams, error) {
	cps := make([]core.CreateParams, len(ps))
	trace := r.core.Trace(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, p := range ps {
		if p.IdempotencyKey == "" {
			r.spawns++
			p.IdempotencyKey = fmt.Sprintf("arbor:run-%d-spawn-%d", r.token, r.spawns)
		} else if strings.HasPrefix(p.IdempotencyKey, "arbor:") {
			return nil, fmt.Errorf("spawn under task %d: idempotency key %q: the prefix \"arbor:\" is arbor's own: %w",
				r.id, p.IdempotencyKey, arbortype.ErrInvalidArgument)
		}
		cp := p.create(r.conv, r.id)
		cp.Tenant = r.Task.Tenant // the conversation's: its children's rows carry it
		cps[i] = core.CreateParams{CreateParams: cp, OwnerToken: r.token, Trace: trace}
	}
	return cps, nil
}

// create is the create of a child of task owner in conversation conv that
// p describes. Every field of SpawnParams is carried (TestSpawnParamsCarried
// fails on one that is not).
func (p SpawnParams) create(conv string, owner int64) arbortype.CreateParams {
	return arbortype.CreateParams{
		ConversationID: conv, OwnerID: owner,
		Kind: p.Kind, Input: p.Input, Background: p.Background, AbandonOnRestart: p.AbandonOnRestart,
		RestartLimit: p.RestartLimit, MaxRetries: p.MaxRetries, IdempotencyKey: p.IdempotencyKey,
		RetryBackoffBase: p.RetryBackoffBase, RetryBackoffCap: p.RetryBackoffCap, Deadline: p.Deadline,
		Budgets: p.Budgets, Priority: p.Priority, ConcurrencyKey: p.ConcurrencyKey,
	}
}

// Children reads every child of the task, with its status, result and error.
func (r *Run) Children(ctx context.Context) ([]arbortype.Task, error) {
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.Children(ctx, db, r.id) })
}

// Waited reads the children of the task's last wait, in id order: after the
// wait woke the task, their outcomes.
func (r *Run) Waited(ctx context.Context) ([]arbortype.Task, error) {
	if len(r.waitIDs) == 0 {
		return nil, nil
	}
	leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.GetMany(ctx, db, r.waitIDs) })
}
