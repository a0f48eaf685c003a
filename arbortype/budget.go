package arbortype

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Budgets (docs/agents.md "Budgets").
//
// A budget is one named counter of one scope — a conversation, or a task
// and its whole subtree — with a maximum. A run reserves an amount before
// an expensive call and records what the call really cost after it; the
// reservation is atomic against every budget above the run's task (its
// own, its owners' up to the turn, the conversation's) and fails closed
// when any of them would go over.

// Counter names arbor gives a meaning to. Any other lower-case name
// (letters, digits, '_' and '.', at most 63 bytes, starting with a letter)
// is a counter of the application's: "tokens", "cost_micros",
// "tool_calls".
const (
	// CounterWallTime is wall time, in milliseconds, from the scope's
	// creation (the task's, or the conversation's first task's). It is not
	// reserved or recorded: every reservation of any counter checks it,
	// and the runners fail a task whose "fail" wall-time budget is over.
	CounterWallTime = "wall_ms"
)

// Unlimited is the Max of a tally: a budget that counts and never refuses.
const Unlimited int64 = math.MaxInt64

// BudgetAction is what a budget's exhaustion does to the run that asked
// for more than is left.
type BudgetAction string

const (
	// BudgetFail fails the task (code "budget_exhausted", not retried);
	// its live foreground subtree is aborted first. The default.
	BudgetFail BudgetAction = "fail"
	// BudgetPark parks the task on the event BudgetEvent: it is listed by
	// PendingEvents, and runs again (from its last checkpoint) when a
	// budget of its conversation is raised, so a person can let the turn
	// go on.
	BudgetPark BudgetAction = "park"
	// BudgetReturn only refuses the reservation: the handler gets
	// ErrBudgetExhausted and decides (an answer from what it has).
	BudgetReturn BudgetAction = "return"
)

// BudgetEvent is the event a task parked by a BudgetPark budget awaits;
// raising a budget of its conversation or of its tenant
// (tasks.Engine.SetBudget) emits it. A park on a tenant budget with a
// window also ends when the window does (the await's timeout).
const BudgetEvent = "arbor:budget"

// BudgetLimit is a budget set with a task when it is created
// (arbortype.CreateParams.Budgets, machine.SpawnParams.Budgets).
type BudgetLimit struct {
	Counter string
	// Max is the most the scope may spend (Unlimited: a tally).
	Max int64
	// OnExhausted: empty means BudgetFail.
	OnExhausted BudgetAction
}

// Budget is one counter of one scope: a conversation, a task's subtree,
// or a tenant (every conversation of it).
type Budget struct {
	// ConversationID is the budget's conversation; empty for a tenant's
	// budget.
	ConversationID string
	// TaskID is the task whose subtree the budget covers; 0 for the
	// conversation.
	TaskID int64
	// Tenant is the tenant of a tenant's budget ("" is the default tenant;
	// ConversationID is then empty).
	Tenant  string
	Counter string
	// Window is a tenant budget's window: 0 (none), time.Minute, time.Hour
	// or 24*time.Hour. Windows are calendar-aligned in UTC (a day starts at
	// 00:00 UTC); Spent counts the window that starts at WindowStart.
	Window      time.Duration
	WindowStart time.Time
	// Max is the most the scope may spend; Unlimited for a tally.
	Max int64
	// Spent is what the scope's subtree recorded; Reserved what its open
	// reservations hold. For CounterWallTime, Spent is the time elapsed
	// since the scope's creation when it was read.
	Spent    int64
	Reserved int64
	// Pruned is the part of Spent recorded by tasks since pruned (retention).
	Pruned      int64
	OnExhausted BudgetAction
	UpdatedAt   time.Time
}

// Left is what the budget still allows (0 when it is over).
func (b Budget) Left() int64 {
	if b.Max == Unlimited {
		return Unlimited
	}
	return max(0, b.Max-b.Spent-b.Reserved)
}

// Spend is what one task recorded (Spent) and holds in open reservations
// (Reserved) of one counter, itself, without its subtree.
type Spend struct {
	TaskID   int64
	Counter  string
	Spent    int64
	Reserved int64
}

// ConversationBudgets is every budget of a conversation and each task's
// own spend.
type ConversationBudgets struct {
	Budgets []Budget
	Spend   []Spend
	// Tenant are the budgets of the conversation's tenant, which count its
	// spend with the spend of the tenant's other conversations.
	Tenant []Budget
}

// Reservation is an amount of a counter held for a run until it records
// what it spent (machine.Run.Reserve, Record).
type Reservation struct {
	ID      int64
	TaskID  int64
	Counter string
	Amount  int64
}

// Errors of budgets.
var (
	// ErrBudgetExhausted: a reservation or spend would take a budget over
	// its maximum. The error is a *BudgetExhaustedError naming the budget.
	ErrBudgetExhausted = errors.New("budget exhausted")
	// ErrUnknownCounter: a reservation or spend of a counter that no budget
	// of the conversation names (a typo must not spend without limit). Set
	// one, a tally (Unlimited) if nothing should be refused.
	ErrUnknownCounter = errors.New("no budget names the counter")
)

// CodeBudgetExhausted is the error code of a task failed by a BudgetFail
// budget.
const CodeBudgetExhausted = "budget_exhausted"

// BudgetExhaustedError names the budget a reservation would have taken
// over its maximum. It matches ErrBudgetExhausted with errors.Is.
type BudgetExhaustedError struct {
	// Budget is the budget as it stood (the first one over, from the task
	// upwards).
	Budget Budget
	// Wanted is the amount asked for.
	Wanted int64
	// Ended says the run is over: the task failed (BudgetFail) or parked
	// (BudgetPark); the handler returns.
	Ended bool
}

func (e *BudgetExhaustedError) Error() string {
	scope := fmt.Sprintf("conversation %q", e.Budget.ConversationID)
	switch {
	case e.Budget.TaskID != 0:
		scope = fmt.Sprintf("task %d", e.Budget.TaskID)
	case e.Budget.ConversationID == "":
		scope = fmt.Sprintf("tenant %q", e.Budget.Tenant)
		if e.Budget.Window != 0 {
			scope += fmt.Sprintf(" per %s from %s", windowName(e.Budget.Window), e.Budget.WindowStart.UTC().Format(time.RFC3339))
		}
	}
	if e.Budget.Counter == CounterWallTime {
		return fmt.Sprintf("budget exhausted: %s of %s: %d ms elapsed of %d", CounterWallTime, scope, e.Budget.Spent, e.Budget.Max)
	}
	return fmt.Sprintf("budget exhausted: %s of %s: %d wanted, %d left of %d (%d spent, %d reserved)",
		e.Budget.Counter, scope, e.Wanted, e.Budget.Left(), e.Budget.Max, e.Budget.Spent, e.Budget.Reserved)
}

// Is makes errors.Is(err, ErrBudgetExhausted) true.
func (e *BudgetExhaustedError) Is(target error) bool { return target == ErrBudgetExhausted }

func windowName(w time.Duration) string {
	switch w {
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	case 24 * time.Hour:
		return "day"
	}
	return w.String()
}
