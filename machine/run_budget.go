package machine

import (
	"context"
	"errors"
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// Budgets in a handler (docs/agents.md "Budgets"): reserve before an
// expensive call, record what it cost after it.
//
//	res, err := run.Reserve(ctx, "tokens", 8000) // the call's most
//	if err != nil {
//		return err // ErrBudgetExhausted: the task failed or parked, or the handler decides
//	}
//	reply, used := callModel(ctx, prompt)
//	if err := run.Record(ctx, res, used); err != nil {
//		return err
//	}

// Reserve holds amount of counter for this run against every budget of
// the counter above its task — its own, its owners' up to the turn, the
// conversation's, and its tenant's (one per window) — atomically: all or
// none. It also checks their
// wall-time budgets (arbortype.CounterWallTime). When a budget would go
// over, the error is a *arbortype.BudgetExhaustedError naming it
// (errors.Is(err, arbortype.ErrBudgetExhausted)), and the budget's action
// has been taken: BudgetFail — the task failed (code "budget_exhausted",
// its foreground subtree aborted) and the run is over; BudgetPark — the
// task is parked on arbortype.BudgetEvent (listed by PendingEvents) until
// a budget of its conversation or its tenant is raised, or, for a tenant
// budget with a window, until that window ends, when it runs again from
// its last checkpoint, and the run is over; BudgetReturn — nothing happened,
// the handler decides. A counter no budget of the conversation or its
// tenant names is arbortype.ErrUnknownCounter.
//
// What is reserved and not recorded by this run (it crashed, it returned)
// is spent in full after the run is over: nothing is lost, nothing counted
// twice. Until then it is held (Budget.Reserved, counted against every
// budget): the next reservation of its counter in the conversation spends
// it, or else the sweep of the runner that leads the schema's maintenance,
// every RunnerConfig.UnknownKindGrace/4 and at most every minute. After a crash the run is over once the task is
// recovered, a conversation lease after the node died.
func (r *Run) Reserve(ctx context.Context, counter string, amount int64) (arbortype.Reservation, error) {
	res, err := r.reserve(ctx, counter, amount, false)
	return reservation(res.Reservation), err
}

// Spend spends amount of counter at once, checked against every budget
// above the task as Reserve is (and with the same actions when one would
// go over): a tool call counted, a cost known in advance.
func (r *Run) Spend(ctx context.Context, counter string, amount int64) error {
	_, err := r.reserve(ctx, counter, amount, true)
	return err
}

func (r *Run) reserve(ctx context.Context, counter string, amount int64, spend bool) (core.ReserveResult, error) {
	r.mu.Lock()
	r.budgets++
	key := fmt.Sprintf("arbor:run-%d-budget-%d", r.token, r.budgets)
	r.mu.Unlock()
	p := core.ReserveParams{ConversationID: r.conv, TaskID: r.id, Token: r.token, Counter: counter, Amount: amount, Key: key, Spend: spend}
	leave, err := r.enter(ctx)
	if err != nil {
		return core.ReserveResult{}, err
	}
	defer leave()
	// A reservation over a budget may fail or park the task in its own
	// transaction: until it is over, the task's new status may be its own
	// doing, and the watchdog must not stop the run for it (the handler
	// would hear "stopped" instead of ErrBudgetExhausted).
	decided := r.mayEnd()
	return detached(ctx, r, func(wctx context.Context) (core.ReserveResult, error) {
		defer decided()
		return r.reserveDetached(wctx, p)
	})
}

func (r *Run) reserveDetached(wctx context.Context, p core.ReserveParams) (core.ReserveResult, error) {
	for {
		res, err := r.core.ReserveBudget(wctx, p)
		if errors.Is(err, arbortype.ErrAmbiguous) && wctx.Err() == nil {
			continue // the key makes the reservation the same one
		}
		var over *arbortype.BudgetExhaustedError
		if errors.As(err, &over) && over.Ended {
			r.sink.ending(r)
			r.mu.Lock()
			r.ended = true
			r.outcome = Outcome{Kind: OutcomeFailed, Err: err}
			if over.Budget.OnExhausted == arbortype.BudgetPark {
				r.outcome = Outcome{Kind: OutcomeAwaiting}
			}
			r.mu.Unlock()
		}
		r.over(err)
		return res, err
	}
}

// Record closes res with what the call really cost: actual replaces the
// amount held on every budget above the task (the unused part released,
// or more spent than held). Recording twice with the same actual is one
// record. A reservation of an earlier run of the task, or one spent in
// full because its run was over first, is refused (ErrNotRunning).
func (r *Run) Record(ctx context.Context, res arbortype.Reservation, actual int64) error {
	if res.TaskID != r.id {
		return fmt.Errorf("record task %d: reservation %d is task %d's: %w", r.id, res.ID, res.TaskID, arbortype.ErrInvalidArgument)
	}
	_, err := writeAtOnce(ctx, r, func(ctx context.Context, db store.DB) (struct{}, error) {
		_, err := r.core.RecordBudget(ctx, db, r.conv, r.id, res.ID, actual)
		return struct{}{}, err
	})
	return err
}

// ReleaseReservation gives back everything res holds: the call was not
// made. It is Record with an actual of 0. (Not to be confused with
// Lease.Release, which gives up a conversation.)
func (r *Run) ReleaseReservation(ctx context.Context, res arbortype.Reservation) error {
	return r.Record(ctx, res, 0)
}

func reservation(r store.ReservationRow) arbortype.Reservation {
	return arbortype.Reservation{ID: r.ID, TaskID: r.TaskID, Counter: r.Counter, Amount: r.Amount}
}
