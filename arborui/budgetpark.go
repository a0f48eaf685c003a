package arborui

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

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

// parkedOn are the budgets above task id (its own, its owners', its
// conversation's) whose action is park: those that may have parked it,
// the ones with nothing left first. A park on a tenant's budget is not
// among them (see the tenant's budgets: arbor budget).
func (h *handler) parkedOn(ctx context.Context, id int64) ([]arbortype.Budget, error) {
	bs, err := h.reader.TaskBudgets(ctx, id)
	if err != nil {
		return nil, err
	}
	var full, room []arbortype.Budget
	for _, b := range bs.Budgets {
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
// conversation's tasks parked on a budget, which reserve anew.
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
