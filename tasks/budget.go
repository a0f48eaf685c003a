package tasks

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// BudgetParams set one budget (see Engine.SetBudget).
type BudgetParams struct {
	// ConversationID is the budget's conversation. Required, but for a
	// tenant's budget (SetTenantBudget), where it must be empty.
	ConversationID string
	// TaskID is the task whose subtree the budget covers (a turn, a
	// sub-agent); 0 for the whole conversation.
	TaskID int64
	// Counter names what is counted: an application's name ("tokens",
	// "cost_micros", "tool_calls": lower-case letters, digits, '_' and
	// '.'), or arbortype.CounterWallTime.
	Counter string
	// Max is the most the scope may spend, 0..2^53; arbortype.Unlimited
	// makes a tally that counts and never refuses.
	Max int64
	// OnExhausted is what a reservation over Max does to its run: fail
	// (the default), park, or return (see arbortype.BudgetAction).
	OnExhausted arbortype.BudgetAction
	// Window makes a tenant's budget (SetTenantBudget) a rate: 0 (none, the default),
	// time.Minute, time.Hour or 24*time.Hour; any other value is
	// arbortype.ErrInvalidArgument. Windows are calendar-aligned in UTC
	// (a per-day budget resets at 00:00 UTC): when one rolls over, Spent
	// starts again from 0, while reservations still open keep holding
	// room. A tenant may have one budget of a counter per window (say 100
	// a minute and 10,000 a day), each checked. Only a tenant's budget
	// has a window.
	Window time.Duration
}

// SetBudget creates or changes a budget, in a transaction of its own. A
// task's spend counts against every budget above it: its own, its
// owners' up to the turn, the conversation's, and its tenant's budgets of
// the counter (one per window). A budget set on a task or a conversation
// that has spent already counts that spend; a tenant's budget counts from
// when it is set (open reservations made before it are not held against
// it), in the current window. Raising a tenant's budget wakes the tasks
// of every conversation of the tenant parked on a budget. Raising a budget (a larger Max, or
// an action that no longer parks) lets the conversation's tasks parked on
// a budget run again: they reserve anew, and one still over parks again.
// An unknown conversation or task is arbortype.ErrNotFound, a task of another
// conversation arbortype.ErrForeignTask, a settled one arbortype.ErrSettled; a bad counter,
// amount, action, tenant or window (or a window on a conversation's budget)
// arbortype.ErrInvalidArgument. Nothing is written then.
func (e *Engine) SetBudget(ctx context.Context, p BudgetParams) (arbortype.Budget, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Budget, error) { return e.setBudget(ctx, tx, p) })
}

// SetBudgetTx is SetBudget inside the caller's transaction.
func (e *Engine) SetBudgetTx(ctx context.Context, tx pgx.Tx, p BudgetParams) (arbortype.Budget, error) {
	return core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Budget, error) { return e.setBudget(ctx, tx, p) })
}

func (e *Engine) setBudget(ctx context.Context, tx pgx.Tx, p BudgetParams) (arbortype.Budget, error) {
	return e.core.SetBudget(ctx, tx, core.BudgetParams{ConversationID: p.ConversationID, TaskID: p.TaskID, Counter: p.Counter,
		Max: p.Max, OnExhausted: p.OnExhausted, Window: p.Window})
}

// SetTenantBudget creates or changes a budget of tenant ("" is the default
// tenant, that of conversations created without one; at most 200 bytes):
// it counts the spend of every conversation of the tenant, and may have a
// Window (a rate limit). p's ConversationID must be empty and its TaskID 0;
// a tenant has no wall-time budget. Otherwise as SetBudget: a reservation
// is checked against it too, and raising it wakes the tenant's tasks
// parked on a budget. It counts from when it is set, in the current window.
func (e *Engine) SetTenantBudget(ctx context.Context, tenant string, p BudgetParams) (arbortype.Budget, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Budget, error) {
		return e.core.SetBudget(ctx, tx, core.BudgetParams{ConversationID: p.ConversationID, TaskID: p.TaskID, Counter: p.Counter,
			Max: p.Max, OnExhausted: p.OnExhausted, Window: p.Window, Tenant: tenant, TenantScope: true})
	})
}

// Budgets reads every budget of a conversation (a wall-time budget's Spent
// is the time elapsed), what each task spent and holds itself, and the
// budgets of the conversation's tenant (Tenant; a window over is read as
// the current one, nothing spent in it).
func (e *Engine) Budgets(ctx context.Context, conversationID string) (arbortype.ConversationBudgets, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.ConversationBudgets, error) {
		bs, spend, err := e.core.Budgets(ctx, db, conversationID)
		if err != nil {
			return arbortype.ConversationBudgets{}, err
		}
		tb, err := e.core.ConversationTenantBudgets(ctx, db, conversationID)
		if err != nil {
			return arbortype.ConversationBudgets{}, err
		}
		out := arbortype.ConversationBudgets{Budgets: bs, Tenant: tb}
		for _, s := range spend {
			out.Spend = append(out.Spend, arbortype.Spend(s))
		}
		return out, nil
	})
}

// Budget reads one budget: counter's of the conversation (taskID 0) or of
// task taskID's subtree, as Budgets reads it (a wall-time budget's Spent is
// the time elapsed). Spent counts closed reservations and Reserved open
// ones: a reservation its run did not record stays in Reserved until it
// is spent in full (see Run.Reserve). No such budget, or no such
// conversation, is arbortype.ErrNotFound.
func (e *Engine) Budget(ctx context.Context, conversationID string, taskID int64, counter string) (arbortype.Budget, error) {
	return core.Read(ctx, e.core, func(db store.DB) (arbortype.Budget, error) {
		return e.core.Budget(ctx, db, conversationID, taskID, counter)
	})
}

// TenantBudgets reads every budget of a tenant ("" is the default
// tenant), by counter and window; a window over is read as the current
// one, nothing spent in it. A tenant without budgets has none (no error).
func (e *Engine) TenantBudgets(ctx context.Context, tenant string) ([]arbortype.Budget, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Budget, error) {
		return e.core.TenantBudgets(ctx, db, tenant)
	})
}
