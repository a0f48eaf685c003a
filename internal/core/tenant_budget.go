package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Tenant budgets (docs/design.md §3.11, migration 004): one counter across
// every conversation of a tenant, with an optional calendar window in UTC.
// They come last in every lock order (conversation → tasks → the
// conversation's budgets → the tenant's budgets, by id): a tenant budget
// row is shared by all the tenant's conversations, so no writer waits on
// anything else while it holds one. SetBudget of a tenant queues first on
// an advisory lock of the tenant's budget writers, then, for a raise,
// locks every conversation of the tenant with a live task (ascending id)
// and wakes their parked tasks, and only then writes the tenant's row:
// a park (which holds its conversation while it reads the tenant's
// budgets) is either seen parked by the raise or reads the raise.

// windowUnit is the unit of a window as the table spells it.
func windowUnit(w time.Duration) (string, error) {
	switch w {
	case 0:
		return "", nil
	case time.Minute:
		return "minute", nil
	case time.Hour:
		return "hour", nil
	case 24 * time.Hour:
		return "day", nil
	}
	return "", fmt.Errorf("window %s: 0, a minute, an hour or a day (24h): %w", w, arbortype.ErrInvalidArgument)
}

func windowOf(unit string) time.Duration {
	switch unit {
	case "minute":
		return time.Minute
	case "hour":
		return time.Hour
	case "day":
		return 24 * time.Hour
	}
	return 0
}

func tenantBudget(b store.TenantBudgetRow) arbortype.Budget {
	out := arbortype.Budget{Tenant: b.Tenant, Counter: b.Counter, Window: windowOf(b.Window), Max: b.Max,
		Spent: b.Spent, Reserved: b.Reserved, OnExhausted: b.OnExhausted, UpdatedAt: b.UpdatedAt}
	if b.WindowStart != nil {
		out.WindowStart = *b.WindowStart
	}
	return out
}

// windowWait is the wait, from now (the database's clock), until a
// windowed tenant budget's window ends; 0 for any other budget (a park
// then awaits a raise without a timeout).
func windowWait(b arbortype.Budget, now time.Time) time.Duration {
	if b.ConversationID != "" || b.Window == 0 {
		return 0
	}
	// A moment past the end, so that the woken run finds it over.
	return max(b.WindowStart.Add(b.Window).Sub(now), 0) + time.Millisecond
}

// setTenantBudget creates or changes a tenant's budget (p checked).
func (e *Engine) setTenantBudget(ctx context.Context, tx pgx.Tx, p BudgetParams) (arbortype.Budget, error) {
	unit, _ := windowUnit(p.Window)
	if err := e.Store.LockTenantBudgetWriters(ctx, tx, p.Tenant); err != nil {
		return arbortype.Budget{}, err
	}
	// Max and action change only under the writers' lock, held here, so
	// the reading stands.
	rows, err := e.Store.ReadTenantBudgets(ctx, tx, p.Tenant, []string{p.Counter})
	if err != nil {
		return arbortype.Budget{}, err
	}
	var old *store.TenantBudgetRow
	for i := range rows {
		if rows[i].Window == unit {
			old = &rows[i]
		}
	}
	if old != nil && (p.Max > old.Max || (old.OnExhausted == arbortype.BudgetPark && p.OnExhausted != arbortype.BudgetPark)) {
		if err := e.wakeTenantParked(ctx, tx, p); err != nil {
			return arbortype.Budget{}, err
		}
	}
	// Last, the tenant's rows of the counter (rolled over if need be).
	if _, err := e.Store.LockTenantBudgets(ctx, tx, p.Tenant, p.Counter); err != nil {
		return arbortype.Budget{}, mapDBError(err)
	}
	if old == nil {
		row, ok, err := e.Store.InsertTenantBudget(ctx, tx, store.TenantBudgetRow{Tenant: p.Tenant, Counter: p.Counter,
			Window: unit, Max: p.Max, OnExhausted: p.OnExhausted})
		if err != nil {
			return arbortype.Budget{}, mapDBError(err)
		}
		if !ok {
			// Inserted by a writer that did not queue on the writers' lock:
			// none does; say so rather than guess.
			return arbortype.Budget{}, fmt.Errorf("budget %q per %q created meanwhile: %w", p.Counter, unit, arbortype.ErrInvalidArgument)
		}
		return tenantBudget(row), nil
	}
	row, err := e.Store.UpdateTenantBudget(ctx, tx, old.ID, p.Max, p.OnExhausted)
	if err != nil {
		return arbortype.Budget{}, mapDBError(err)
	}
	return tenantBudget(row), nil
}

// wakeTenantParked emits BudgetEvent to every task of the tenant parked on
// it: each conversation of the tenant with a live task locked first, in
// ascending id.
func (e *Engine) wakeTenantParked(ctx context.Context, tx pgx.Tx, p BudgetParams) error {
	convs, err := e.Store.LockTenantLiveConversations(ctx, tx, p.Tenant)
	if err != nil {
		return err
	}
	payload, err := json.Marshal(map[string]any{"counter": p.Counter, "tenant": p.Tenant, "window": p.Window.String(), "max": budgetMax(p.Max)})
	if err != nil {
		return err
	}
	for _, conv := range convs {
		if err := e.emitBudgetParked(ctx, tx, conv, payload); err != nil {
			return err
		}
	}
	return nil
}

// TenantBudgets reads every budget of a tenant ("" the default tenant), a
// window over read as the current one with nothing spent in it.
func (e *Engine) TenantBudgets(ctx context.Context, db store.DB, tenant string) ([]arbortype.Budget, error) {
	if err := checkText("tenant", tenant, false); err != nil {
		return nil, fmt.Errorf("budgets of tenant: %w", err)
	}
	rows, err := e.Store.ReadTenantBudgets(ctx, db, tenant, nil)
	if err != nil {
		return nil, fmt.Errorf("budgets of tenant %q: %w", tenant, err)
	}
	out := make([]arbortype.Budget, len(rows))
	for i, b := range rows {
		out[i] = tenantBudget(b)
	}
	return out, nil
}
