package core

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// CreateParams is a create as the engine takes it: the user's
// arbortype.CreateParams as it is (arbortype.CreateParams is the same type),
// and what only arbor's own callers set. The turn policy fields (OnBusy,
// SteerEvent) are package tasks' to apply; the engine ignores them.
type CreateParams struct {
	arbortype.CreateParams
	// OwnerToken, when not 0, fences the create by the owner's run: the
	// owner must be running with this token (a handler spawning children
	// passes its own), so a runner that lost the task cannot add children
	// to it (ErrLeaseLost, ErrNotRunning or ErrAborted).
	OwnerToken int64
	// Trace is the trace context to store with the task (see
	// arbortype.Task.Trace): at most MaxTraceBytes as JSON, no empty key.
	// Nil for none.
	Trace map[string]string
}

// MaxCreateBudgets bounds the budgets one create sets on its task, and on
// its conversation: each is a row written and locked in the create's
// transaction.
const MaxCreateBudgets = 64

// HasBudgets says whether p sets budgets (its create then needs
// ApplyCreateBudgets in its transaction).
func (p CreateParams) HasBudgets() bool { return len(p.Budgets)+len(p.ConversationBudgets) > 0 }

// MaxTraceBytes bounds a task's trace context, encoded as JSON (the
// tasks table's check says the same).
const MaxTraceBytes = 4096

// Create creates a task (see tasks.Engine.Create). created is false when
// the idempotency key matched an existing task, which is returned instead.
func (e *Engine) Create(ctx context.Context, tx pgx.Tx, p CreateParams) (Task, bool, error) {
	params, err := e.createParams(p)
	if err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", err)
	}
	if p.OwnerID != 0 {
		// The owner's conversation never changes, so it can be read before
		// any lock; a foreign or unknown owner is refused before anything
		// is written.
		conv, err := e.Store.TaskConversation(ctx, tx, p.OwnerID)
		switch {
		case store.IsNoRows(err):
			return Task{}, false, fmt.Errorf("create task: owner %d: %w", p.OwnerID, arbortype.ErrNotFound)
		case err != nil:
			return Task{}, false, fmt.Errorf("create task: %w", err)
		case conv != p.ConversationID:
			return Task{}, false, fmt.Errorf("create task: owner %d is in conversation %q, not %q: %w",
				p.OwnerID, conv, p.ConversationID, arbortype.ErrForeignOwner)
		}
	}
	conv, err := e.Store.EnsureAndLockConversation(ctx, tx, p.ConversationID, p.Tenant)
	if err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", mapDBError(err))
	}
	if err := checkTenant(conv.ID, conv.Tenant, p.Tenant); err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", err)
	}
	if p.IdempotencyKey != "" {
		existing, err := e.Store.TaskByIdempotencyKey(ctx, tx, p.ConversationID, p.IdempotencyKey)
		switch {
		case err == nil:
			if existing.Kind != p.Kind || existing.OwnerID != p.OwnerID {
				return Task{}, false, fmt.Errorf("create task: key %q is task %d (kind %q, owner %d): %w",
					p.IdempotencyKey, existing.ID, existing.Kind, existing.OwnerID, arbortype.ErrIdempotencyConflict)
			}
			return existing, false, nil
		case !store.IsNoRows(err):
			return Task{}, false, fmt.Errorf("create task: %w", err)
		}
	}
	if p.OwnerID != 0 {
		owner, err := e.Store.LockTask(ctx, tx, p.ConversationID, p.OwnerID)
		if err != nil {
			return Task{}, false, fmt.Errorf("create task: owner %d: %w", p.OwnerID, err)
		}
		if err := ownerCanSpawn(owner); err != nil {
			return Task{}, false, fmt.Errorf("create task: %w", err)
		}
		if p.OwnerToken != 0 {
			if err := checkHolder(owner, p.OwnerToken); err != nil {
				return Task{}, false, fmt.Errorf("create task: owner %d: %w", owner.ID, err)
			}
		}
	}
	task, err := e.Store.InsertTask(ctx, tx, params)
	if err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", mapDBError(err))
	}
	return task, true, nil
}

// CreateRoot creates a root task (p.OwnerID 0) in one statement of its own,
// committed on its own — no BEGIN, no COMMIT: one round trip, as a turn
// created per message wants. ok is false, with nothing written, when the
// caller must create it in a transaction instead (Create): its
// conversation was created concurrently, or its idempotency key is taken.
// A statement that may have committed before its answer was lost is
// ErrAmbiguous, as a lost COMMIT is.
func CreateRoot(ctx context.Context, e *Engine, p CreateParams) (t Task, ok bool, err error) {
	if p.OwnerID != 0 || p.HasBudgets() {
		return Task{}, false, nil
	}
	params, err := e.createParams(p)
	if err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", err)
	}
	type res struct {
		t  Task
		ok bool
	}
	r, err := Write(ctx, e, func(db store.DB) (res, error) {
		// A runner of this process with a worker free may have the
		// statement start the task (start.go). Asked once the connection is
		// in hand, so that its grant (its claim lock read-held) lasts the
		// statement alone; each try asks again.
		g, _ := e.Grant([]CreateParams{p})
		var holder int64
		if g != nil {
			holder = g.Holder()
		}
		t, ok, err := e.Store.CreateRoot(ctx, db, params, holder, e.startLease())
		if g == nil {
			return res{t, ok}, err
		}
		switch {
		case err != nil && !commitAnswered(err) && (transient(err) || contextError(err)):
			// What Write will answer: the statement may have landed.
			g.Done(nil, fmt.Errorf("%w: %w", arbortype.ErrAmbiguous, err))
		case IsGuardRefusal(err):
			// The guard refused the start (nothing was written): a limit
			// of the task's kind or tenant committed between the
			// statement's snapshot and the guard's. The task is queued.
			g.Done(nil, err)
			t, ok, err = e.Store.CreateRoot(ctx, db, params, 0, 0)
		default:
			g.Done(Started([]Task{t}), err)
		}
		return res{t, ok}, err
	})
	if err != nil {
		return Task{}, false, fmt.Errorf("create task: %w", err)
	}
	if r.ok && r.t.Status != arbortype.StatusRunning {
		e.announce(p.ConversationID)
	}
	return r.t, r.ok, nil
}

// checkTenant refuses a create that names another tenant than its
// conversation's ("" names none).
func checkTenant(conv, has, named string) error {
	if named != "" && named != has {
		return fmt.Errorf("conversation %q belongs to tenant %q, not %q: %w", conv, has, named, arbortype.ErrInvalidArgument)
	}
	return nil
}

// MaxPriority bounds a task's priority either way: an hour of aging.
const MaxPriority = 3600

// ownerCanSpawn says whether owner, locked, may take a new child.
func ownerCanSpawn(owner Task) error {
	switch {
	case owner.Status.Settled():
		return fmt.Errorf("owner %d is %s: %w", owner.ID, owner.Status, arbortype.ErrOwnerNotLive)
	case owner.AbortRequested:
		return fmt.Errorf("owner %d: %w", owner.ID, arbortype.ErrOwnerAborting)
	case owner.Status == arbortype.StatusCompleting:
		return fmt.Errorf("owner %d: %w", owner.ID, arbortype.ErrOwnerCompleting)
	}
	return nil
}

func (e *Engine) createParams(p CreateParams) (store.InsertParams, error) {
	if err := checkText("conversation id", p.ConversationID, true); err != nil {
		return store.InsertParams{}, err
	}
	if err := checkText("kind", p.Kind, true); err != nil {
		return store.InsertParams{}, err
	}
	if err := checkText("idempotency key", p.IdempotencyKey, false); err != nil {
		return store.InsertParams{}, err
	}
	if err := e.checkJSON("input", p.Input); err != nil {
		return store.InsertParams{}, err
	}
	for what, list := range map[string][]arbortype.BudgetLimit{"budgets": p.Budgets, "conversation budgets": p.ConversationBudgets} {
		if len(list) > MaxCreateBudgets {
			return store.InsertParams{}, fmt.Errorf("%d %s, over the limit of %d: %w", len(list), what, MaxCreateBudgets, arbortype.ErrInvalidArgument)
		}
		seen := make(map[string]bool, len(list))
		for _, b := range list {
			if _, err := checkBudgetParams(BudgetParams{ConversationID: p.ConversationID, Counter: b.Counter, Max: b.Max, OnExhausted: b.OnExhausted}); err != nil {
				return store.InsertParams{}, err
			}
			if seen[b.Counter] {
				return store.InsertParams{}, fmt.Errorf("%s: counter %q given twice: %w", what, b.Counter, arbortype.ErrInvalidArgument)
			}
			seen[b.Counter] = true
		}
	}
	if p.OwnerID < 0 {
		return store.InsertParams{}, fmt.Errorf("owner id %d: %w", p.OwnerID, arbortype.ErrInvalidArgument)
	}
	if p.Background && p.OwnerID == 0 {
		return store.InsertParams{}, fmt.Errorf("a root task cannot be background: %w", arbortype.ErrInvalidArgument)
	}
	if p.OwnerToken != 0 && p.OwnerID == 0 {
		return store.InsertParams{}, fmt.Errorf("an owner token without an owner: %w", arbortype.ErrInvalidArgument)
	}
	if p.MaxRetries < 0 || p.MaxRetries > maxInt32 {
		return store.InsertParams{}, fmt.Errorf("max retries %d is outside 0..%d: %w", p.MaxRetries, maxInt32, arbortype.ErrInvalidArgument)
	}
	base, ceiling := cmp.Or(p.RetryBackoffBase, e.Cfg.RetryBackoffBase), cmp.Or(p.RetryBackoffCap, e.Cfg.RetryBackoffCap)
	if p.RetryBackoffCap == 0 {
		ceiling = max(ceiling, base)
	}
	if err := ValidateBackoff(base, ceiling); err != nil {
		return store.InsertParams{}, err
	}
	limit := p.RestartLimit
	switch {
	case limit == 0:
		limit = e.Cfg.RestartLimit
	case limit == arbortype.RestartLimitNone:
		limit = 0
	case limit < 0 || limit > maxInt32:
		return store.InsertParams{}, fmt.Errorf("restart limit %d is outside 0..%d (or RestartLimitNone): %w", limit, maxInt32, arbortype.ErrInvalidArgument)
	}
	var deadline *time.Time
	if !p.Deadline.IsZero() {
		if y := p.Deadline.UTC().Year(); y < 1 || y > 9999 {
			return store.InsertParams{}, fmt.Errorf("deadline %s is out of range: %w", p.Deadline, arbortype.ErrInvalidArgument)
		}
		d := p.Deadline
		deadline = &d
	}
	trace, err := traceJSON(p.Trace)
	if err != nil {
		return store.InsertParams{}, err
	}
	if err := checkText("tenant", p.Tenant, false); err != nil {
		return store.InsertParams{}, err
	}
	if err := checkText("concurrency key", p.ConcurrencyKey, false); err != nil {
		return store.InsertParams{}, err
	}
	prio := p.Priority
	if prio == 0 {
		prio = e.Cfg.KindPriorities[p.Kind]
	}
	if prio < -MaxPriority || prio > MaxPriority {
		return store.InsertParams{}, fmt.Errorf("priority %d is outside -%d..%d: %w", prio, MaxPriority, MaxPriority, arbortype.ErrInvalidArgument)
	}
	switch {
	case p.QueueTTL < 0 || p.QueueTTL > 100*365*24*time.Hour:
		return store.InsertParams{}, fmt.Errorf("queue TTL %s is outside 0..100y: %w", p.QueueTTL, arbortype.ErrInvalidArgument)
	case p.QueueTTL > 0 && p.QueueTTL < time.Microsecond:
		return store.InsertParams{}, fmt.Errorf("queue TTL %s is below a microsecond: %w", p.QueueTTL, arbortype.ErrInvalidArgument)
	}
	return store.InsertParams{
		Trace:            trace,
		ConversationID:   p.ConversationID,
		OwnerID:          p.OwnerID,
		Kind:             p.Kind,
		Background:       p.Background,
		Input:            p.Input,
		RestartLimit:     limit,
		AbandonOnRestart: p.AbandonOnRestart,
		MaxRetries:       p.MaxRetries,
		RetryBackoffBase: base,
		RetryBackoffCap:  ceiling,
		IdempotencyKey:   p.IdempotencyKey,
		Deadline:         deadline,
		Tenant:           p.Tenant,
		Priority:         prio,
		QueueTTL:         p.QueueTTL,
		ConcurrencyKey:   p.ConcurrencyKey,
	}, nil
}

// traceJSON encodes a task's trace context, refusing one that is too large
// or has an empty key.
func traceJSON(trace map[string]string) (json.RawMessage, error) {
	if len(trace) == 0 {
		return nil, nil
	}
	for k := range trace {
		if k == "" {
			return nil, fmt.Errorf("trace context: an empty key: %w", arbortype.ErrInvalidArgument)
		}
	}
	b, err := json.Marshal(trace)
	if err != nil {
		return nil, fmt.Errorf("trace context: %w: %w", arbortype.ErrInvalidArgument, err)
	}
	if len(b) > MaxTraceBytes {
		return nil, fmt.Errorf("trace context: %d bytes as JSON, over %d: %w", len(b), MaxTraceBytes, arbortype.ErrInvalidArgument)
	}
	return b, nil
}

// LockLiveRoots locks conversation conv (creating it on first use) and
// returns its live root tasks, oldest first: what a turn policy looks at.
func (e *Engine) LockLiveRoots(ctx context.Context, tx pgx.Tx, conv, tenant string) ([]Task, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	if err := checkText("tenant", tenant, false); err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	c, err := e.Store.EnsureAndLockConversation(ctx, tx, conv, tenant)
	if err != nil {
		return nil, fmt.Errorf("create task: %w", mapDBError(err))
	}
	if err := checkTenant(c.ID, c.Tenant, tenant); err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	roots, err := e.Store.LiveRoots(ctx, tx, conv)
	if err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	return roots, nil
}
