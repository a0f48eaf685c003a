package core

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Budgets (docs/agents.md "Budgets", docs/design.md §4 invariant 10).
//
// A budget row is one counter of one scope: the conversation, or a task
// and its subtree. Its spent and reserved are, exactly, the sums of the
// closed and the open reservations of the tasks of its scope (the checker
// verifies it). A reservation is made by a run, for its task, against
// every budget of the counter above it (its own, its owners' up to the
// root, the conversation's) at once, and it is closed exactly once: by its
// run's record (reserved → spent, the actual amount), or — the run over
// first (it crashed, was taken over, ended, or its task settled) — in
// full: the reserved amount becomes spent, an upper bound of what the call
// cost, so a crash between reserve and record neither loses spend nor
// counts it twice.
//
// Locking. Every writer of a counter's budgets in a conversation locks all
// of them, ordered by scope with the conversation's first, before it
// changes them; a budget of a counter always comes with the conversation's
// row of that counter (SetBudget makes a tally when there is none), so
// that row is the counter's mutex in its conversation. Budgets come last
// in every transaction's lock order (conversation → tasks → budgets): no
// writer locks a live task after a budget (the prune, which carries the
// spend of the settled tasks it deletes into the conversation's budgets,
// locks only those settled rows after them, which no budget writer
// locks). Reserve's common path locks the reserving task FOR SHARE and
// then the budgets, not the conversation (runners lock conversations for
// their batches): it only checks and moves amounts. That path, and every
// record, is one statement that commits on its own (the schema baseline's
// functions budget_reserve and budget_record, which take those locks in
// that order). A reservation off it (a budget over, an unknown counter, a
// lapse to close) has that statement write nothing and is made again in a
// transaction (reserve below) that locks as the function does and closes
// the lapses. When a budget is over and its action ends the run (fail,
// park), the reservation is made again in a transaction that locks the
// conversation and the task first and reads the budgets without locking
// them, then ends the run (which locks its subtree and owner). The failure
// or the park and SetBudget's raise (which emits BudgetEvent to the parked
// tasks under the same conversation lock) are thus ordered, so a raise
// cannot slip between the check and the park and be lost.
//
// A tenant's budgets of a counter (tenant_budget.go) come after all of
// these, locked by id: conversation → tasks → the conversation's budgets
// → the tenant's budgets.

// MaxBudgetAmount bounds one amount (reserve, record, spend, max): sums of
// many stay far from overflowing a bigint.
const MaxBudgetAmount int64 = 1 << 53

var counterRE = regexp.MustCompile(`^[a-z][a-z0-9_.]{0,62}$`)

func checkCounter(counter string) error {
	if !counterRE.MatchString(counter) {
		return fmt.Errorf("counter %q: lower-case letters, digits, '_' and '.', starting with a letter, at most 63 bytes: %w",
			counter, arbortype.ErrInvalidArgument)
	}
	return nil
}

func checkAmount(what string, n int64) error {
	if n < 0 || n > MaxBudgetAmount {
		return fmt.Errorf("%s %d is outside 0..%d: %w", what, n, MaxBudgetAmount, arbortype.ErrInvalidArgument)
	}
	return nil
}

// BudgetParams set one budget (see tasks.Engine.SetBudget).
type BudgetParams struct {
	ConversationID string
	// TaskID: the task whose subtree the budget covers; 0 for the
	// conversation.
	TaskID      int64
	Counter     string
	Max         int64
	OnExhausted arbortype.BudgetAction
	// Tenant, with TenantScope, makes a tenant's budget.
	Tenant      string
	TenantScope bool
	// Window is a tenant budget's window: 0, a minute, an hour or a day.
	Window time.Duration
}

// tenantScope says that p sets a tenant's budget.
func (p BudgetParams) tenantScope() bool { return p.TenantScope }

func checkBudgetParams(p BudgetParams) (BudgetParams, error) {
	if err := checkCounter(p.Counter); err != nil {
		return p, err
	}
	if err := checkText("tenant", p.Tenant, false); err != nil {
		return p, err
	}
	if _, err := windowUnit(p.Window); err != nil {
		return p, err
	}
	if p.tenantScope() {
		if p.ConversationID != "" || p.TaskID != 0 {
			return p, fmt.Errorf("a tenant's budget with conversation %q, task %d: it names neither: %w", p.ConversationID, p.TaskID, arbortype.ErrInvalidArgument)
		}
		if p.Counter == arbortype.CounterWallTime {
			return p, fmt.Errorf("counter %s: a tenant has no wall-time budget: %w", p.Counter, arbortype.ErrInvalidArgument)
		}
	} else {
		if err := checkText("conversation id", p.ConversationID, true); err != nil {
			return p, err
		}
		if p.Window != 0 {
			return p, fmt.Errorf("window %s on a budget of conversation %q: only a tenant's budget has a window: %w",
				p.Window, p.ConversationID, arbortype.ErrInvalidArgument)
		}
	}
	if p.TaskID < 0 {
		return p, fmt.Errorf("task id %d: %w", p.TaskID, arbortype.ErrInvalidArgument)
	}
	if p.Max != arbortype.Unlimited {
		if err := checkAmount("max", p.Max); err != nil {
			return p, err
		}
	}
	switch p.OnExhausted {
	case "":
		p.OnExhausted = arbortype.BudgetFail
	case arbortype.BudgetFail, arbortype.BudgetPark, arbortype.BudgetReturn:
	default:
		return p, fmt.Errorf("on exhausted %q: one of fail, park, return: %w", p.OnExhausted, arbortype.ErrInvalidArgument)
	}
	return p, nil
}

// limitParams are the BudgetParams of a budget set with a create (checked
// by createParams before anything was written).
func limitParams(conv string, taskID int64, b arbortype.BudgetLimit) BudgetParams {
	p, _ := checkBudgetParams(BudgetParams{ConversationID: conv, TaskID: taskID, Counter: b.Counter, Max: b.Max, OnExhausted: b.OnExhausted})
	return p
}

// SetBudget creates or changes one budget; the conversation must exist
// and a task scope must be a live task of it. A new budget counts what its
// scope spent and holds already. A budget raised (a larger maximum, or an
// action that no longer parks) wakes the conversation's tasks parked on
// BudgetEvent: they run again and reserve anew.
func (e *Engine) SetBudget(ctx context.Context, tx pgx.Tx, p BudgetParams) (arbortype.Budget, error) {
	p, err := checkBudgetParams(p)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if p.tenantScope() {
		b, err := e.setTenantBudget(ctx, tx, p)
		if err != nil {
			return arbortype.Budget{}, fmt.Errorf("set budget of tenant %q: %w", p.Tenant, err)
		}
		return b, nil
	}
	if _, err := e.Store.LockConversation(ctx, tx, p.ConversationID); err != nil {
		if store.IsNoRows(err) {
			err = fmt.Errorf("conversation %q: %w", p.ConversationID, arbortype.ErrNotFound)
		}
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if p.TaskID != 0 {
		t, err := e.Store.GetTask(ctx, tx, p.TaskID)
		switch {
		case store.IsNoRows(err):
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d: %w", p.TaskID, arbortype.ErrNotFound)
		case err != nil:
			return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
		case t.ConversationID != p.ConversationID:
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d is in conversation %q, not %q: %w",
				p.TaskID, t.ConversationID, p.ConversationID, arbortype.ErrForeignTask)
		case t.Status.Settled():
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d is %s: %w", p.TaskID, t.Status, arbortype.ErrSettled)
		}
	}
	// A raise wakes the parked tasks first: their rows are locked before
	// the budgets (budgets come last in every lock order). Max and action
	// change only under the conversation's lock, held here, so the reading
	// stands.
	rows, err := e.Store.ReadBudgets(ctx, tx, p.ConversationID, []string{p.Counter})
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if i := slices.IndexFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == p.TaskID }); i >= 0 {
		old := rows[i]
		if p.Max > old.Max || (old.OnExhausted == arbortype.BudgetPark && p.OnExhausted != arbortype.BudgetPark) {
			if err := e.wakeBudgetParked(ctx, tx, p); err != nil {
				return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
			}
		}
	}
	row, err := e.setBudgetLocked(ctx, tx, p)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	return budget(row), nil
}

// setBudgetLocked writes a budget under the conversation's lock: the
// counter's budgets locked, the conversation's tally made when missing.
func (e *Engine) setBudgetLocked(ctx context.Context, tx pgx.Tx, p BudgetParams) (store.BudgetRow, error) {
	rows, err := e.Store.LockBudgets(ctx, tx, p.ConversationID, []string{p.Counter})
	if err != nil {
		return store.BudgetRow{}, err
	}
	if !slices.ContainsFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == 0 }) && p.TaskID != 0 {
		if _, _, err := e.Store.InsertBudget(ctx, tx, store.BudgetRow{ConversationID: p.ConversationID, Counter: p.Counter,
			Max: arbortype.Unlimited, OnExhausted: arbortype.BudgetFail}); err != nil {
			return store.BudgetRow{}, mapDBError(err)
		}
	}
	want := store.BudgetRow{ConversationID: p.ConversationID, TaskID: p.TaskID, Counter: p.Counter, Max: p.Max, OnExhausted: p.OnExhausted}
	i := slices.IndexFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == p.TaskID })
	if i < 0 {
		row, _, err := e.Store.InsertBudget(ctx, tx, want)
		return row, mapDBError(err)
	}
	row, err := e.Store.UpdateBudget(ctx, tx, want)
	return row, mapDBError(err)
}

// wakeBudgetParked emits BudgetEvent to every task of the conversation
// parked on it (each reserves again when it runs; one still over parks
// again).
func (e *Engine) wakeBudgetParked(ctx context.Context, tx pgx.Tx, b BudgetParams) error {
	payload, err := json.Marshal(map[string]any{"counter": b.Counter, "task_id": b.TaskID, "max": budgetMax(b.Max)})
	if err != nil {
		return err
	}
	return e.emitBudgetParked(ctx, tx, b.ConversationID, payload)
}

// emitBudgetParked emits BudgetEvent with payload to every task of conv
// (locked by the caller) parked on it.
func (e *Engine) emitBudgetParked(ctx context.Context, tx pgx.Tx, conv string, payload json.RawMessage) error {
	parked, err := e.Store.PendingAwaits(ctx, tx, conv)
	if err != nil {
		return err
	}
	for _, t := range parked {
		if t.AwaitName != arbortype.BudgetEvent {
			continue
		}
		if _, err := e.Emit(ctx, tx, EmitParams{ConversationID: conv, TaskID: t.ID,
			Name: arbortype.BudgetEvent, Payload: payload, Queue: true}); err != nil {
			return err
		}
	}
	return nil
}

func budgetMax(m int64) any {
	if m == arbortype.Unlimited {
		return nil
	}
	return m
}

// ApplyCreateBudgets sets the budgets of the tasks just created (ts[i]
// from ps[i]; the conversations are locked by the create): each
// ConversationBudgets entry where the conversation has no budget of the
// counter, then each task's Budgets. Tasks that existed already (created
// false: an idempotency key's repeat) are left as they are.
func (e *Engine) ApplyCreateBudgets(ctx context.Context, tx pgx.Tx, ps []CreateParams, ts []Task, created []bool) error {
	for i, p := range ps {
		if !created[i] || !p.HasBudgets() {
			continue
		}
		for _, b := range p.ConversationBudgets {
			rows, err := e.Store.LockBudgets(ctx, tx, p.ConversationID, []string{b.Counter})
			if err != nil {
				return err
			}
			if slices.ContainsFunc(rows, func(r store.BudgetRow) bool { return r.TaskID == 0 }) {
				continue
			}
			if _, err := e.setBudgetLocked(ctx, tx, limitParams(p.ConversationID, 0, b)); err != nil {
				return err
			}
		}
		for _, b := range p.Budgets {
			if _, err := e.setBudgetLocked(ctx, tx, limitParams(p.ConversationID, ts[i].ID, b)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Budgets reads every budget of a conversation (wall-time budgets with the
// time elapsed as their spend) and each task's own spend.
func (e *Engine) Budgets(ctx context.Context, db store.DB, conv string) ([]arbortype.Budget, []store.TaskSpend, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, nil, fmt.Errorf("budgets: %w", err)
	}
	rows, err := e.Store.ConversationBudgets(ctx, db, conv)
	if err != nil {
		return nil, nil, fmt.Errorf("budgets of %q: %w", conv, err)
	}
	spend, err := e.Store.SpendByTask(ctx, db, conv)
	if err != nil {
		return nil, nil, fmt.Errorf("budgets of %q: %w", conv, err)
	}
	out := make([]arbortype.Budget, len(rows))
	for i, b := range rows {
		out[i] = budget(b)
	}
	return out, spend, nil
}

// ConversationTenantBudgets reads the budgets of conv's tenant (a window
// over read as the current one, nothing spent in it).
func (e *Engine) ConversationTenantBudgets(ctx context.Context, db store.DB, conv string) ([]arbortype.Budget, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, fmt.Errorf("budgets: %w", err)
	}
	tenant, err := e.Store.ConversationTenant(ctx, db, conv)
	if store.IsNoRows(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("budgets of %q: %w", conv, err)
	}
	return e.TenantBudgets(ctx, db, tenant)
}

// Budget reads the budget of counter of one scope of conv: the
// conversation's (taskID 0) or a task's. No such budget is ErrNotFound,
// saying whether the conversation exists.
func (e *Engine) Budget(ctx context.Context, db store.DB, conv string, taskID int64, counter string) (arbortype.Budget, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return arbortype.Budget{}, fmt.Errorf("budget: %w", err)
	}
	what := fmt.Sprintf("budget %q of conversation %q", counter, conv)
	if taskID != 0 {
		what = fmt.Sprintf("budget %q of task %d of conversation %q", counter, taskID, conv)
	}
	rows, err := e.Store.ConversationBudgets(ctx, db, conv)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("%s: %w", what, err)
	}
	for _, b := range rows {
		if b.TaskID == taskID && b.Counter == counter {
			return budget(b), nil
		}
	}
	if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
		if store.IsNoRows(err) {
			return arbortype.Budget{}, fmt.Errorf("%s: no such conversation: %w", what, arbortype.ErrNotFound)
		}
		return arbortype.Budget{}, fmt.Errorf("%s: %w", what, err)
	}
	return arbortype.Budget{}, fmt.Errorf("%s: none is set: %w", what, arbortype.ErrNotFound)
}

func budget(b store.BudgetRow) arbortype.Budget {
	return arbortype.Budget{ConversationID: b.ConversationID, TaskID: b.TaskID, Counter: b.Counter, Max: b.Max,
		Spent: b.Spent, Reserved: b.Reserved, Pruned: b.Carried, OnExhausted: b.OnExhausted, UpdatedAt: b.UpdatedAt}
}
