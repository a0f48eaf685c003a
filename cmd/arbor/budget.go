package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const budgetHelp = `Usage: arbor budget CONVERSATION [COUNTER MAX] [flags]
       arbor budget --tenant TENANT [COUNTER MAX] [--window minute|hour|day] [flags]

With only a conversation, lists its budgets (the conversation's and each
task's, with what is spent and held), what each task spent itself, and
the budgets of its tenant.

With a counter and a maximum, sets that budget: on the conversation, or
with --task on one task and its subtree. MAX is a count (tokens, micro-units
of cost, tool calls; milliseconds for wall_ms) or "unlimited" for a tally.
Raising a budget lets the conversation's tasks parked on a budget run
again. --on-exhausted says what a reservation over it does: fail (the
default: the task fails, its subtree aborted), park (it waits for a
raise), return (the handler decides).

With --tenant (and no conversation), the same for a tenant's budgets,
which count every conversation of the tenant ("" is the default tenant):
listed, or set. --window makes a tenant budget a rate: its spend starts
from 0 at every whole minute, hour or day (calendar windows in UTC; a
day starts at 00:00 UTC), and a task parked on it runs again when its
window ends. A tenant has one budget of a counter per window. Raising a
tenant's budget lets its tasks parked on a budget, in every conversation
of the tenant, run again.

Example:
  arbor budget chat-42
  arbor budget chat-42 tokens 200000
  arbor budget chat-42 tokens 50000 --task 17 --on-exhausted park
  arbor budget --tenant acme
  arbor budget --tenant acme tokens 5000000 --window day --on-exhausted park
`

func cmdBudget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("budget", budgetHelp, stderr)
	var db dbFlags
	db.register(fs)
	task := fs.Int64("task", 0, "set the budget on this task (and its subtree) rather than the conversation")
	action := fs.String("on-exhausted", "", "fail, park or return (default fail)")
	tenant := fs.String("tenant", "", "list or set the budgets of this tenant (no conversation then)")
	window := fs.String("window", "", "a tenant budget's window: minute, hour or day (default none)")
	pos, err := parseArgs(fs, args, 0, 3, "the conversation id, and a counter and its maximum to set one")
	if err != nil {
		return err
	}
	byTenant := false
	fs.Visit(func(f *flag.Flag) { byTenant = byTenant || f.Name == "tenant" })
	if byTenant {
		// The tenant's budgets: no conversation; pos is [COUNTER MAX].
		pos = append([]string{""}, pos...)
	}
	switch {
	case len(pos) == 0:
		return fmt.Errorf("budget: missing the conversation id, or --tenant (see arbor budget --help)")
	case len(pos) == 2:
		return fmt.Errorf("budget: a counter needs its maximum (or none of the two, to list)")
	case len(pos) > 3:
		return fmt.Errorf("budget: unexpected argument %q (see arbor budget --help)", pos[3])
	}
	var max int64
	if len(pos) == 3 {
		if pos[2] == "unlimited" {
			max = arbortype.Unlimited
		} else if max, err = strconv.ParseInt(pos[2], 10, 64); err != nil || max < 0 {
			return fmt.Errorf("budget: maximum %q is not a count ≥ 0 or \"unlimited\"", pos[2])
		}
	}
	win, ok := windows[*window]
	if !ok {
		return fmt.Errorf("budget: window %q is not one of minute, hour, day", *window)
	}
	if win != 0 && !byTenant {
		return fmt.Errorf("budget: --window is for a tenant's budget (--tenant)")
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if byTenant {
		return tenantBudgets(ctx, engine.Engine, stdout, *tenant, pos[1:], tasks.BudgetParams{Counter: "",
			Max: max, OnExhausted: arbortype.BudgetAction(*action), Window: win, TaskID: *task})
	}
	conv := pos[0]
	if _, err := requireConversation(ctx, engine, conv); err != nil {
		return err
	}
	if len(pos) == 3 {
		b, err := engine.SetBudget(ctx, tasks.BudgetParams{ConversationID: conv, TaskID: *task, Counter: pos[1],
			Max: max, OnExhausted: arbortype.BudgetAction(*action)})
		if err != nil {
			return fmt.Errorf("budget: %w", err)
		}
		fmt.Fprintf(stdout, "budget %s of %s: %s\n", printable(b.Counter), scopeText(b.TaskID), budgetText(b))
		return nil
	}
	all, err := engine.Budgets(ctx, conv)
	if err != nil {
		return fmt.Errorf("budget: %w", err)
	}
	if len(all.Budgets) == 0 {
		fmt.Fprintf(stdout, "conversation %s has no budgets\n", printable(conv))
	}
	for _, b := range all.Budgets {
		fmt.Fprintf(stdout, "budget %s of %s: %s\n", printable(b.Counter), scopeText(b.TaskID), budgetText(b))
	}
	for _, sp := range all.Spend {
		fmt.Fprintf(stdout, "spent %s by task #%d: %s\n", printable(sp.Counter), sp.TaskID, spendText(sp))
	}
	for _, b := range all.Tenant {
		fmt.Fprintf(stdout, "budget %s of %s: %s\n", printable(b.Counter), tenantScopeText(b), budgetText(b))
	}
	return nil
}

// windows are the --window values.
var windows = map[string]time.Duration{"": 0, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}

// tenantBudgets lists a tenant's budgets, or, with pos [COUNTER MAX], sets
// one as p says.
func tenantBudgets(ctx context.Context, engine *tasks.Engine, stdout io.Writer, tenant string, pos []string, p tasks.BudgetParams) error {
	if len(pos) == 2 {
		p.Counter = pos[0]
		b, err := engine.SetTenantBudget(ctx, tenant, p)
		if err != nil {
			return fmt.Errorf("budget: %w", err)
		}
		fmt.Fprintf(stdout, "budget %s of %s: %s\n", printable(b.Counter), tenantScopeText(b), budgetText(b))
		return nil
	}
	bs, err := engine.TenantBudgets(ctx, tenant)
	if err != nil {
		return fmt.Errorf("budget: %w", err)
	}
	if len(bs) == 0 {
		fmt.Fprintf(stdout, "tenant %s has no budgets\n", printable(strconv.Quote(tenant)))
	}
	for _, b := range bs {
		fmt.Fprintf(stdout, "budget %s of %s: %s\n", printable(b.Counter), tenantScopeText(b), budgetText(b))
	}
	return nil
}

// tenantScopeText names a tenant budget's scope: its tenant, and its
// window with when it started.
func tenantScopeText(b arbortype.Budget) string {
	s := "tenant " + printable(strconv.Quote(b.Tenant))
	for name, w := range windows {
		if w == b.Window && w != 0 {
			s += " per " + name + " from " + b.WindowStart.UTC().Format("2006-01-02T15:04Z")
		}
	}
	return s
}

func scopeText(taskID int64) string {
	if taskID == 0 {
		return "the conversation"
	}
	return fmt.Sprintf("task #%d", taskID)
}
