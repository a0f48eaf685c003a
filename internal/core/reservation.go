package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Reservations: a run's reserve, record and spend, and the closing in full
// of those whose run is over (lapsed). What a reservation is, and the
// locking every writer of budgets follows, is the comment at the top of
// budget.go.

// ReserveParams describe a reservation (or, with Spend, a spend) of a run.
type ReserveParams struct {
	// ConversationID is the task's conversation (the run's).
	ConversationID string
	TaskID, Token  int64
	Counter        string
	Amount         int64
	// Key makes the reservation idempotent per task (a run's own key: a
	// write retried after a lost commit answer is the same reservation).
	Key string
	// Spend closes the reservation at once: Amount is spent.
	Spend bool
}

// ReserveResult is what a reservation came to.
type ReserveResult struct {
	Reservation store.ReservationRow
	// Exhausted, when not nil, names the budget that refused; Ended (in
	// it) says the run was ended by its action in this transaction.
	Exhausted *arbortype.BudgetExhaustedError
}

// errNeedsConversation: a budget over whose action ends the run; the
// reservation is made again with the conversation locked.
var errNeedsConversation = errors.New("budget over: again with the conversation locked")

// ReserveBudget reserves (or spends) p.Amount of p.Counter for the run of
// p.TaskID held with p.Token, against every budget of the counter above
// the task. On the common path — every budget has room, no reservation of
// the counter in the conversation is left by a run that is over — it is
// one statement that commits on its own (store's ReserveAtOnce). Else
// that statement writes nothing and the reservation is made in a
// transaction of its own (two when a budget's action ends the run; see
// the comment on budgets at the top of budget.go). The error of a budget
// over is a *arbortype.BudgetExhaustedError (ErrBudgetExhausted).
func (e *Engine) ReserveBudget(ctx context.Context, p ReserveParams) (ReserveResult, error) {
	if err := checkReserveParams(p); err != nil {
		return ReserveResult{}, errorf("reserve", p.TaskID, err)
	}
	res, rare, err := e.reserveAtOnce(ctx, p)
	if err == nil && rare {
		res, err = Tx(ctx, e, func(tx pgx.Tx) (ReserveResult, error) { return e.reserve(ctx, tx, p, false) })
		if errors.Is(err, errNeedsConversation) {
			res, err = Tx(ctx, e, func(tx pgx.Tx) (ReserveResult, error) { return e.reserve(ctx, tx, p, true) })
		}
	}
	if err == nil && res.Exhausted != nil {
		err = res.Exhausted
	}
	if err != nil {
		return res, errorf("reserve", p.TaskID, err)
	}
	return res, nil
}

func checkReserveParams(p ReserveParams) error {
	if err := checkCounter(p.Counter); err != nil {
		return err
	}
	if p.Counter == arbortype.CounterWallTime {
		return fmt.Errorf("counter %s is wall time, checked by every reservation, not reserved: %w", p.Counter, arbortype.ErrInvalidArgument)
	}
	if err := checkAmount("amount", p.Amount); err != nil {
		return err
	}
	return checkText("idempotency key", p.Key, true)
}

// reserveAtOnce tries the common path of a reservation in one statement;
// rare says it was not on it, and nothing was written.
func (e *Engine) reserveAtOnce(ctx context.Context, p ReserveParams) (res ReserveResult, rare bool, err error) {
	type atOnce struct {
		res  ReserveResult
		rare bool
	}
	v, err := Write(ctx, e, func(db store.DB) (atOnce, error) {
		o, err := e.Store.ReserveAtOnce(ctx, db, store.ReservationRow{ConversationID: p.ConversationID, TaskID: p.TaskID,
			Counter: p.Counter, RunToken: p.Token, IdempotencyKey: p.Key, Amount: p.Amount}, p.Spend)
		if err != nil {
			return atOnce{}, err
		}
		switch o.Outcome {
		case store.AtOnceReserved, store.AtOnceAgain:
			return atOnce{res: ReserveResult{Reservation: o.Reservation}}, nil
		case store.AtOnceNoTask:
			return atOnce{}, arbortype.ErrNotFound
		case store.AtOnceNotHeld:
			if err := checkHolder(Task{Status: o.Status, Token: o.Token}, p.Token); err != nil {
				return atOnce{}, err
			}
		}
		return atOnce{rare: true}, nil
	})
	return v.res, v.rare, err
}

// reserve makes a reservation in tx: the rare paths of ReserveBudget,
// which checked p.
func (e *Engine) reserve(ctx context.Context, tx pgx.Tx, p ReserveParams, conversationLocked bool) (ReserveResult, error) {
	var held Task
	if conversationLocked {
		t, err := e.lockConversationOf(ctx, tx, p.TaskID)
		if err != nil {
			return ReserveResult{}, err
		}
		held = t
	}
	rt, err := e.Store.RunTask(ctx, tx, p.ConversationID, p.TaskID)
	if store.IsNoRows(err) {
		return ReserveResult{}, arbortype.ErrNotFound
	}
	if err != nil {
		return ReserveResult{}, err
	}
	if prior, err := e.Store.ReservationByKey(ctx, tx, rt.ConversationID, p.TaskID, p.Key); err == nil {
		return ReserveResult{Reservation: prior}, nil
	} else if !store.IsNoRows(err) {
		return ReserveResult{}, err
	}
	if err := checkHolder(Task{Status: rt.Status, Token: rt.Token}, p.Token); err != nil {
		return ReserveResult{}, err
	}
	chain, err := e.Store.ScopeChain(ctx, tx, rt.ConversationID, p.TaskID)
	if err != nil {
		return ReserveResult{}, err
	}
	counters := []string{p.Counter, arbortype.CounterWallTime}
	if conversationLocked {
		// The run may end here, and ending it locks tasks (its subtree, its
		// owner): that must not come after budget locks, which the common
		// path takes after its task's. So the budgets are read, not locked:
		// a lapse moves amounts from reserved to spent and leaves what is
		// left unchanged, and a raise takes the conversation's lock, held
		// here, so the reading stands until the end is written.
		rows, err := e.Store.ReadBudgets(ctx, tx, rt.ConversationID, counters)
		if err != nil {
			return ReserveResult{}, err
		}
		// The tenant's budgets too: a raise of one locks this
		// conversation before it writes (tenant_budget.go).
		trows, err := e.Store.ReadTenantBudgets(ctx, tx, rt.Tenant, []string{p.Counter})
		if err != nil {
			return ReserveResult{}, err
		}
		over, _, err := e.overBudget(ctx, tx, rt.ConversationID, chain, rows, trows, p.Counter, p.Amount)
		if err != nil {
			return ReserveResult{}, err
		}
		if over != nil && over.Budget.OnExhausted != arbortype.BudgetReturn {
			var now time.Time
			if len(chain) > 0 {
				now = chain[0].Now
			}
			if err := e.endOnExhausted(ctx, tx, held, p.Token, over, windowWait(over.Budget, now)); err != nil {
				return ReserveResult{}, err
			}
			over.Ended = true
			return ReserveResult{Exhausted: over}, nil
		}
		// Released meanwhile: reserve as the common path does (no task is
		// locked after the budgets from here on).
	}
	rows, err := e.Store.LockBudgets(ctx, tx, rt.ConversationID, counters)
	if err != nil {
		return ReserveResult{}, err
	}
	rows, err = e.lapseLocked(ctx, tx, rt.ConversationID, p.Counter, rows)
	if err != nil {
		return ReserveResult{}, err
	}
	// The tenant's budgets of the counter, last, their windows rolled over.
	trows, err := e.Store.LockTenantBudgets(ctx, tx, rt.Tenant, p.Counter)
	if err != nil {
		return ReserveResult{}, mapDBError(err)
	}
	scopes := scopeIDs(chain)
	over, known, err := e.overBudget(ctx, tx, rt.ConversationID, chain, rows, trows, p.Counter, p.Amount)
	if err != nil {
		return ReserveResult{}, err
	}
	if !known {
		return ReserveResult{}, fmt.Errorf("counter %q in conversation %q: %w", p.Counter, rt.ConversationID, arbortype.ErrUnknownCounter)
	}
	if over != nil {
		if over.Budget.OnExhausted == arbortype.BudgetReturn || conversationLocked {
			// (Locked: it went over again between the reading and the
			// locks; the handler is told, the run goes on.)
			return ReserveResult{}, over
		}
		return ReserveResult{}, errNeedsConversation
	}
	r := store.ReservationRow{ConversationID: rt.ConversationID, TaskID: p.TaskID, Counter: p.Counter,
		RunToken: p.Token, IdempotencyKey: p.Key, Amount: p.Amount, TenantBudgets: tenantIDs(trows)}
	held2, spent := -p.Amount, int64(0)
	if p.Spend {
		r.Actual = &p.Amount
		held2, spent = 0, p.Amount
	}
	if err := e.Store.ChargeBudgets(ctx, tx, rt.ConversationID, p.Counter, scopes, held2, spent); err != nil {
		return ReserveResult{}, mapDBError(err)
	}
	if len(r.TenantBudgets) > 0 {
		if err := e.Store.ChargeTenantBudgets(ctx, tx, r.TenantBudgets, held2, spent); err != nil {
			return ReserveResult{}, mapDBError(err)
		}
	}
	r, err = e.Store.InsertReservation(ctx, tx, r)
	if err != nil {
		return ReserveResult{}, mapDBError(err)
	}
	return ReserveResult{Reservation: r}, nil
}

// endOnExhausted ends the run of t (locked with its conversation) as the
// budget over says: fail (its foreground subtree aborted) or park on
// BudgetEvent from its last checkpoint.
// A park on a windowed budget awaits at most until its window ends
// (timeout): the task then runs again and reserves anew.
func (e *Engine) endOnExhausted(ctx context.Context, tx pgx.Tx, t Task, token int64, over *arbortype.BudgetExhaustedError, timeout time.Duration) error {
	if over.Budget.OnExhausted == arbortype.BudgetPark {
		_, err := e.AwaitEvent(ctx, tx, t.ID, token, AwaitParams{Name: arbortype.BudgetEvent, Timeout: timeout, Phase: t.Phase, State: t.State})
		return err
	}
	detail, err := json.Marshal(map[string]any{"counter": over.Budget.Counter, "task_id": over.Budget.TaskID,
		"max": over.Budget.Max, "spent": over.Budget.Spent, "reserved": over.Budget.Reserved, "wanted": over.Wanted})
	if err != nil {
		return err
	}
	_, err = e.Fail(ctx, tx, t.ID, &token, TaskError{Code: arbortype.CodeBudgetExhausted, NonRetryable: true, Message: over.Error(), Detail: detail})
	return err
}

// overBudget checks amount of counter against the locked budgets of the
// chain (task first, then its owners, then the conversation) and their
// wall-time budgets, then the tenant's budgets of the counter (trows); it
// returns the first one over, and whether any budget of the counter
// exists in the conversation or its tenant.
func (e *Engine) overBudget(ctx context.Context, tx pgx.Tx, conv string, chain []store.ScopeNode, rows []store.BudgetRow, trows []store.TenantBudgetRow, counter string, amount int64) (*arbortype.BudgetExhaustedError, bool, error) {
	find := func(c string, scope int64) *store.BudgetRow {
		for i := range rows {
			if rows[i].Counter == c && rows[i].TaskID == scope {
				return &rows[i]
			}
		}
		return nil
	}
	known := slices.ContainsFunc(rows, func(b store.BudgetRow) bool { return b.Counter == counter }) ||
		slices.ContainsFunc(trows, func(b store.TenantBudgetRow) bool { return b.Counter == counter })
	var now time.Time
	if len(chain) > 0 {
		now = chain[0].Now
	}
	for _, scope := range scopeIDs(chain) {
		if b := find(arbortype.CounterWallTime, scope); b != nil && b.Max != arbortype.Unlimited {
			started, err := e.scopeCreated(ctx, tx, conv, chain, scope)
			if err != nil {
				return nil, known, err
			}
			if elapsed := now.Sub(started).Milliseconds(); elapsed >= b.Max {
				bb := budget(*b)
				bb.Spent = elapsed
				return &arbortype.BudgetExhaustedError{Budget: bb, Wanted: amount}, known, nil
			}
		}
		if b := find(counter, scope); b != nil && b.Max != arbortype.Unlimited && amount > b.Max-b.Spent-b.Reserved {
			return &arbortype.BudgetExhaustedError{Budget: budget(*b), Wanted: amount}, known, nil
		}
	}
	for _, b := range trows {
		if b.Counter == counter && b.Max != arbortype.Unlimited && amount > b.Max-b.Spent-b.Reserved {
			return &arbortype.BudgetExhaustedError{Budget: tenantBudget(b), Wanted: amount}, known, nil
		}
	}
	return nil, known, nil
}

func tenantIDs(rows []store.TenantBudgetRow) []int64 {
	ids := make([]int64, len(rows))
	for i, b := range rows {
		ids[i] = b.ID
	}
	return ids
}

func (e *Engine) scopeCreated(ctx context.Context, tx pgx.Tx, conv string, chain []store.ScopeNode, scope int64) (time.Time, error) {
	for _, n := range chain {
		if n.TaskID == scope {
			return n.CreatedAt, nil
		}
	}
	return e.Store.ConversationCreated(ctx, tx, conv)
}

// scopeIDs are the scopes of a chain: its tasks, then the conversation (0).
func scopeIDs(chain []store.ScopeNode) []int64 {
	ids := make([]int64, 0, len(chain)+1)
	for _, n := range chain {
		ids = append(ids, n.TaskID)
	}
	return append(ids, 0)
}

// lapseLocked closes, in full, the open reservations of counter in conv
// whose run is over, under the counter's budget locks, and returns the
// budgets as they then stand.
func (e *Engine) lapseLocked(ctx context.Context, tx pgx.Tx, conv, counter string, rows []store.BudgetRow) ([]store.BudgetRow, error) {
	// The tenant's budgets of the counter are locked too, last, before the
	// open reservations are read: they are what every closer of a
	// reservation of a counter only tenant budgets name locks (and a
	// reservation's own lock, after this, is no new wait).
	tenant, err := e.Store.ConversationTenant(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	if _, err := e.Store.LockTenantBudgets(ctx, tx, tenant, counter); err != nil {
		return nil, mapDBError(err)
	}
	open, err := e.Store.OpenReservations(ctx, tx, conv, counter)
	if err != nil {
		return nil, err
	}
	lapsed := false
	for _, r := range open {
		if !r.RunOver {
			continue
		}
		chain, err := e.Store.ScopeChain(ctx, tx, conv, r.TaskID)
		if err != nil {
			return nil, err
		}
		if err := e.closeReservation(ctx, tx, r, scopeIDs(chain), r.Amount, true); err != nil {
			return nil, err
		}
		lapsed = true
	}
	if !lapsed {
		return rows, nil
	}
	return e.Store.LockBudgets(ctx, tx, conv, uniqueCounters(rows))
}

func uniqueCounters(rows []store.BudgetRow) []string {
	var out []string
	for _, b := range rows {
		if !slices.Contains(out, b.Counter) {
			out = append(out, b.Counter)
		}
	}
	return out
}

func (e *Engine) closeReservation(ctx context.Context, tx pgx.Tx, r store.ReservationRow, scopes []int64, actual int64, lapsed bool) error {
	ok, err := e.Store.CloseReservation(ctx, tx, r.ConversationID, r.ID, actual, lapsed)
	if err != nil {
		return mapDBError(err)
	}
	if !ok {
		return fmt.Errorf("reservation %d closed meanwhile: %w", r.ID, arbortype.ErrInvalidArgument)
	}
	if err := e.Store.ChargeBudgets(ctx, tx, r.ConversationID, r.Counter, scopes, r.Amount, actual); err != nil {
		return mapDBError(err)
	}
	if len(r.TenantBudgets) == 0 {
		return nil
	}
	return mapDBError(e.Store.ChargeTenantBudgets(ctx, tx, r.TenantBudgets, r.Amount, actual))
}

// RecordBudget closes reservation id of task taskID with what was really
// spent (actual, which may be more or less than the amount held: the
// difference is released, or spent beyond), in one statement (store's
// RecordAtOnce): on db, a connection of the pool, it commits on its own.
// It is idempotent: a record repeated with the same actual changes
// nothing. A reservation closed in full because its run was over first is
// ErrNotRunning (its amount is spent already); one recorded with another
// actual ErrInvalidArgument. Recording does not need the run to hold its
// task still: the reservation is what is fenced (closed once).
func (e *Engine) RecordBudget(ctx context.Context, db store.DB, conv string, taskID, id, actual int64) (store.ReservationRow, error) {
	if err := checkAmount("actual", actual); err != nil {
		return store.ReservationRow{}, errorf("record", taskID, err)
	}
	o, err := e.Store.RecordAtOnce(ctx, db, conv, taskID, id, actual)
	if err != nil {
		return store.ReservationRow{}, errorf("record", taskID, mapDBError(err))
	}
	r := o.Reservation
	switch {
	case o.Outcome == store.AtOnceRecorded:
		return r, nil
	case o.Outcome == store.AtOnceNoReservation:
		return store.ReservationRow{}, errorf("record", taskID, fmt.Errorf("reservation %d is not one of the task's: %w", id, arbortype.ErrNotFound))
	case o.Outcome == store.AtOnceRaced:
		return r, errorf("record", taskID, fmt.Errorf("reservation %d closed meanwhile: %w", id, arbortype.ErrInvalidArgument))
	case o.Outcome != store.AtOnceClosed || r.Actual == nil:
		return r, errorf("record", taskID, fmt.Errorf("reservation %d: outcome %q", id, o.Outcome))
	case r.Lapsed:
		return r, errorf("record", taskID, fmt.Errorf("reservation %d was charged in full (%d) when its run ended before this record: %w",
			id, r.Amount, arbortype.ErrNotRunning))
	case *r.Actual == actual:
		return r, nil
	}
	return r, errorf("record", taskID, fmt.Errorf("reservation %d was recorded as %d already: %w", id, *r.Actual, arbortype.ErrInvalidArgument))
}

// SweepLapsed closes in full the open reservations of counter in conv
// whose run is over (the runners' maintenance: a crashed run's
// reservations stop holding budget without waiting for the next
// reservation of the counter).
func (e *Engine) SweepLapsed(ctx context.Context, tx pgx.Tx, conv, counter string) error {
	rows, err := e.Store.LockBudgets(ctx, tx, conv, []string{counter})
	if err != nil {
		return err
	}
	_, err = e.lapseLocked(ctx, tx, conv, counter, rows)
	return err
}

// LapsedReservations lists up to limit counters of conversations holding a
// reservation whose run is over.
func (e *Engine) LapsedReservations(ctx context.Context, db store.DB, limit int) ([]store.ConversationCounter, error) {
	return e.Store.LapsedReservations(ctx, db, limit)
}
