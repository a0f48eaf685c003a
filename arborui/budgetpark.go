package arborui

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// A turn parked on a budget (docs/design.md §3.11): a reservation over a
// budget whose action is park left its task awaiting
// arbortype.BudgetEvent, which no answer ends — EmitToken refuses it —
// only a raise of a budget of its conversation (tasks.Engine.SetBudget,
// which emits the event to every task so parked). The views show it as
// parked on a budget, with the budgets above the task whose action is
// park, and the action that raises one; never approve or deny.
//
// The park does not record which budget was over, nor the amount asked
// for: the views show every park budget above the task, with what it has
// spent and holds, the one at or over its maximum first.

// parkedOn are the budgets above task t (its own, its owners', its
// conversation's, its tenant's) whose action is park: those that may have
// parked it, the ones with nothing left first.
func (h *handler) parkedOn(ctx context.Context, t arbortype.Task) ([]arbortype.Budget, error) {
	bs, err := h.reader.TaskBudgets(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	tenant, err := h.engine.TenantBudgets(ctx, t.Tenant)
	if err != nil {
		return nil, err
	}
	var full, room []arbortype.Budget
	for _, b := range append(bs.Budgets, tenant...) {
		switch {
		case b.OnExhausted != arbortype.BudgetPark:
		case b.Left() == 0:
			full = append(full, b)
		default:
			room = append(room, b)
		}
	}
	return append(full, room...), nil
}

// raiseArg is the "raise" template's argument: the form that raises
// budget B of task Task's conversation.
type raiseArg struct {
	CSRF, Back, P string
	Task          int64
	B             arbortype.Budget
	// Suggest is the form's proposed maximum: twice the current one.
	Suggest int64
}

func raiseOf(csrf, back, prefix string, task int64, b arbortype.Budget) raiseArg {
	suggest := b.Max * 2
	if b.Max >= 1<<52 {
		suggest = 1 << 53
	}
	if suggest <= b.Max {
		suggest = b.Max + 1
	}
	return raiseArg{CSRF: csrf, Back: back, P: prefix, Task: task, B: b, Suggest: suggest}
}

// raise raises a budget of task id's conversation from the form: its
// scope (the task whose subtree the budget covers, 0 for the
// conversation), counter and new max, which must be above the budget's
// maximum now. The budget keeps its action; SetBudget wakes the
// conversation's tasks parked on a budget, which reserve anew. With
// "tenant" set, it is the budget of the task's tenant of that counter and
// "window" (in seconds, 0 for none), raised by SetTenantBudget, which
// wakes the tenant's tasks parked on a budget.
func (h *handler) raise(r *http.Request, id int64) error {
	ctx := r.Context()
	scope, err := strconv.ParseInt(r.PostFormValue("scope"), 10, 64)
	if err != nil || scope < 0 {
		return badRequest("scope %s is not a task id, nor 0 for the conversation", strconv.Quote(truncate(r.PostFormValue("scope"), 40)))
	}
	counter := r.PostFormValue("counter")
	if counter == "" {
		return badRequest("no counter: the form names the budget's counter")
	}
	s := strings.TrimSpace(r.PostFormValue("max"))
	newMax, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return badRequest("max %s is not a whole number", strconv.Quote(truncate(s, 40)))
	}
	t, err := h.engine.Get(ctx, id)
	if err != nil {
		return err
	}
	if r.PostFormValue("tenant") != "" {
		return h.raiseTenant(r, t, counter, newMax)
	}
	b, err := h.engine.Budget(ctx, t.ConversationID, scope, counter)
	if err != nil {
		return err
	}
	if newMax <= b.Max {
		return badRequest("max %d is not a raise: the budget's maximum is %d already; nothing was written", newMax, b.Max)
	}
	_, err = h.engine.SetBudget(ctx, tasks.BudgetParams{ConversationID: t.ConversationID, TaskID: scope, Counter: counter,
		Max: newMax, OnExhausted: b.OnExhausted})
	if err != nil {
		return fmt.Errorf("raise the budget: %w", err)
	}
	return nil
}

// raiseTenant raises the budget of task t's tenant of counter and the
// form's window to newMax.
func (h *handler) raiseTenant(r *http.Request, t arbortype.Task, counter string, newMax int64) error {
	secs, err := strconv.ParseInt(r.PostFormValue("window"), 10, 64)
	if err != nil || secs < 0 || secs > 86400 {
		return badRequest("window %s is not a number of seconds (0 for none)", strconv.Quote(truncate(r.PostFormValue("window"), 40)))
	}
	window := time.Duration(secs) * time.Second
	bs, err := h.engine.TenantBudgets(r.Context(), t.Tenant)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(bs, func(b arbortype.Budget) bool { return b.Counter == counter && b.Window == window })
	if i < 0 {
		return &requestError{code: http.StatusNotFound, msg: fmt.Sprintf("tenant %q has no budget of %q over a window of %s; nothing was written",
			t.Tenant, counter, window)}
	}
	if newMax <= bs[i].Max {
		return badRequest("max %d is not a raise: the budget's maximum is %d already; nothing was written", newMax, bs[i].Max)
	}
	_, err = h.engine.SetTenantBudget(r.Context(), t.Tenant, tasks.BudgetParams{Counter: counter, Max: newMax,
		OnExhausted: bs[i].OnExhausted, Window: window})
	if err != nil {
		return fmt.Errorf("raise the budget of tenant %q: %w", t.Tenant, err)
	}
	return nil
}
