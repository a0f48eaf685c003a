package core

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// budgetViolations checks invariant 10: every budget's spent and reserved
// are exactly the sums of the closed and the open reservations of the
// tasks of its scope (the task and its subtree; the whole conversation
// for the conversation's), and a budget of a task names a task of the
// conversation.
func (e *Engine) budgetViolations(ctx context.Context, tx pgx.Tx, conv string, byID map[int64]*Task) ([]Violation, error) {
	budgets, spend, err := e.Budgets(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	var out []Violation
	for _, s := range spend {
		if byID[s.TaskID] == nil {
			out = append(out, Violation{Invariant: 10, ConversationID: conv, TaskID: s.TaskID,
				Message: "a reservation of " + s.Counter + " by task " + strconv.FormatInt(s.TaskID, 10) + ", which is not in the conversation"})
		}
	}
	// within says whether task id is in the subtree of scope.
	within := func(id, scope int64) bool {
		for t := byID[id]; t != nil; t = byID[t.OwnerID] {
			if t.ID == scope {
				return true
			}
			if t.OwnerID == 0 {
				break
			}
		}
		return false
	}
	for _, b := range budgets {
		if b.Counter == arbortype.CounterWallTime {
			continue
		}
		if b.TaskID != 0 && byID[b.TaskID] == nil {
			out = append(out, Violation{Invariant: 10, ConversationID: conv, TaskID: b.TaskID,
				Message: "a budget of " + b.Counter + " for a task that is not in the conversation"})
			continue
		}
		spent, reserved := b.Pruned, int64(0)
		for _, s := range spend {
			if s.Counter == b.Counter && (b.TaskID == 0 || within(s.TaskID, b.TaskID)) {
				spent += s.Spent
				reserved += s.Reserved
			}
		}
		if spent != b.Spent || reserved != b.Reserved {
			out = append(out, Violation{Invariant: 10, ConversationID: conv, TaskID: b.TaskID,
				Message: formatBudgetMismatch(b, spent, reserved)})
		}
	}
	return out, nil
}

func formatBudgetMismatch(b arbortype.Budget, spent, reserved int64) string {
	return "budget " + b.Counter + ": spent " + strconv.FormatInt(b.Spent, 10) + " and reserved " + strconv.FormatInt(b.Reserved, 10) +
		", but its scope's reservations sum to spent " + strconv.FormatInt(spent, 10) + " and reserved " + strconv.FormatInt(reserved, 10)
}

// maxTenantBudgets bounds the tenant budgets one Check reads.
const maxTenantBudgets = 10000

// tenantBudgetViolations checks invariant 10 for tenant budgets, across
// conversations (Check without conversations, in one snapshot): a tenant
// budget's reserved is exactly the sum of the open reservations that
// charged it, and its spent at least what the closed ones its window
// counts recorded (the prune deletes reservations but not their spend).
func (e *Engine) tenantBudgetViolations(ctx context.Context, tx pgx.Tx) ([]Violation, error) {
	sums, err := e.Store.CheckTenantBudgets(ctx, tx, maxTenantBudgets)
	if err != nil {
		return nil, err
	}
	var out []Violation
	for _, b := range sums {
		if b.Reserved != b.Open || b.Spent < b.Closed {
			out = append(out, Violation{Invariant: 10, Message: fmt.Sprintf(
				"budget %s of tenant %q (window %q): spent %d and reserved %d, but the reservations that charged it hold %d open and closed %d in its window",
				b.Counter, b.Tenant, b.Window, b.Spent, b.Reserved, b.Open, b.Closed)})
		}
	}
	return out, nil
}
