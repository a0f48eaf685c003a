package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const budgetHelp = `Usage: arbor budget CONVERSATION [COUNTER MAX] [flags]

With only a conversation, lists its budgets (the conversation's and each
task's, with what is spent and held) and what each task spent itself.

With a counter and a maximum, sets that budget: on the conversation, or
with --task on one task and its subtree. MAX is a count (tokens, micro-units
of cost, tool calls; milliseconds for wall_ms) or "unlimited" for a tally.
Raising a budget lets the conversation's tasks parked on a budget run
again. --on-exhausted says what a reservation over it does: fail (the
default: the task fails, its subtree aborted), park (it waits for a
raise), return (the handler decides).

Example:
  arbor budget chat-42
  arbor budget chat-42 tokens 200000
  arbor budget chat-42 tokens 50000 --task 17 --on-exhausted park
`

func cmdBudget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("budget", budgetHelp, stderr)
	var db dbFlags
	db.register(fs)
	task := fs.Int64("task", 0, "set the budget on this task (and its subtree) rather than the conversation")
	action := fs.String("on-exhausted", "", "fail, park or return (default fail)")
	pos, err := parseArgs(fs, args, 1, 3, "the conversation id, and a counter and its maximum to set one")
	if err != nil {
		return err
	}
	if len(pos) == 2 {
		return fmt.Errorf("budget: a counter needs its maximum (or none of the two, to list)")
	}
	var max int64
	if len(pos) == 3 {
		if pos[2] == "unlimited" {
			max = arbortype.Unlimited
		} else if max, err = strconv.ParseInt(pos[2], 10, 64); err != nil || max < 0 {
			return fmt.Errorf("budget: maximum %q is not a count ≥ 0 or \"unlimited\"", pos[2])
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
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
	return nil
}

func scopeText(taskID int64) string {
	if taskID == 0 {
		return "the conversation"
	}
	return fmt.Sprintf("task #%d", taskID)
}
