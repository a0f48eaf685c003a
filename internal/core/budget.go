package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Budgets (docs/agents.md "Budgets", docs/design.md §4 invariant 10).
//
// A budget row is one counter of one scope: the conversation, or a task
// and its subtree. Its spent and reserved are, exactly, the sums of the
// closed and the open reservations of the tasks of its scope (the checker
// verifies it). A reservation is made by a run, for its task, against
// every budget of the counter above it (its own, its owners' up to the
// root, the conversation's) at once, and it is closed exactly once: by its
// run's record (reserved → spent, the actual amount), or — the run over
// first (it crashed, was taken over, ended, or its task settled) — in
// full: the reserved amount becomes spent, an upper bound of what the call
// cost, so a crash between reserve and record neither loses spend nor
// counts it twice.
//
// Locking. Every writer of a counter's budgets in a conversation locks all
// of them, ordered by scope with the conversation's first, before it
// changes them; a budget of a counter always comes with the conversation's
// row of that counter (SetBudget makes a tally when there is none), so
// that row is the counter's mutex in its conversation. Budgets come last
// in every transaction's lock order (conversation → tasks → budgets): no
// writer locks a live task after a budget (the prune, which carries the
// spend of the settled tasks it deletes into the conversation's budgets,
// locks only those settled rows after them, which no budget writer
// locks). Reserve's common path locks the reserving task FOR SHARE and
// then the budgets, not the conversation (runners lock conversations for
// their batches): it only checks and moves amounts. That path, and every
// record, is one statement that commits on its own (migration 027's
// functions budget_reserve and budget_record, which take those locks in
// that order). A reservation off it (a budget over, an unknown counter, a
// lapse to close) has that statement write nothing and is made again in a
// transaction (reserve below) that locks as the function does and closes
// the lapses. When a budget is over and its action ends the run (fail,
// park), the reservation is made again in a transaction that locks the
// conversation and the task first and reads the budgets without locking
// them, then ends the run (which locks its subtree and owner). The failure
// or the park and SetBudget's raise (which emits BudgetEvent to the parked
// tasks under the same conversation lock) are thus ordered, so a raise
// cannot slip between the check and the park and be lost.

// MaxBudgetAmount bounds one amount (reserve, record, spend, max): sums of
// many stay far from overflowing a bigint.
const MaxBudgetAmount int64 = 1 << 53

var counterRE = regexp.MustCompile(`^[a-z][a-z0-9_.]{0,62}$`)

func checkCounter(counter string) error {
	if !counterRE.MatchString(counter) {
		return fmt.Errorf("counter %q: lower-case letters, digits, '_' and '.', starting with a letter, at most 63 bytes: %w",
			counter, arbortype.ErrInvalidArgument)
	}
	return nil
}

func checkAmount(what string, n int64) error {
	if n < 0 || n > MaxBudgetAmount {
		return fmt.Errorf("%s %d is outside 0..%d: %w", what, n, MaxBudgetAmount, arbortype.ErrInvalidArgument)
	}
	return nil
}

// BudgetParams set one budget (see tasks.Engine.SetBudget).
type BudgetParams struct {
	ConversationID string
	// TaskID: the task whose subtree the budget covers; 0 for the
	// conversation.
	TaskID      int64
	Counter     string
	Max         int64
	OnExhausted arbortype.BudgetAction
}

func checkBudgetParams(p BudgetParams) (BudgetParams, error) {
	if err := checkText("conversation id", p.ConversationID, true); err != nil {
		return p, err
	}
	if err := checkCounter(p.Counter); err != nil {
		return p, err
	}
	if p.TaskID < 0 {
		return p, fmt.Errorf("task id %d: %w", p.TaskID, arbortype.ErrInvalidArgument)
	}
	if p.Max != arbortype.Unlimited {
		if err := checkAmount("max", p.Max); err != nil {
			return p, err
		}
	}
	switch p.OnExhausted {
	case "":
		p.OnExhausted = arbortype.BudgetFail
	case arbortype.BudgetFail, arbortype.BudgetPark, arbortype.BudgetReturn:
	default:
		return p, fmt.Errorf("on exhausted %q: one of fail, park, return: %w", p.OnExhausted, arbortype.ErrInvalidArgument)
	}
	return p, nil
}

// limitParams are the BudgetParams of a budget set with a create (checked
// by createParams before anything was written).
func limitParams(conv string, taskID int64, b arbortype.BudgetLimit) BudgetParams {
	p, _ := checkBudgetParams(BudgetParams{ConversationID: conv, TaskID: taskID, Counter: b.Counter, Max: b.Max, OnExhausted: b.OnExhausted})
	return p
}

// SetBudget creates or changes one budget; the conversation must exist
// and a task scope must be a live task of it. A new budget counts what its
// scope spent and holds already. A budget raised (a larger maximum, or an
// action that no longer parks) wakes the conversation's tasks parked on
// BudgetEvent: they run again and reserve anew.
func (e *Engine) SetBudget(ctx context.Context, tx pgx.Tx, p BudgetParams) (arbortype.Budget, error) {
	p, err := checkBudgetParams(p)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if _, err := e.Store.LockConversation(ctx, tx, p.ConversationID); err != nil {
		if store.IsNoRows(err) {
			err = fmt.Errorf("conversation %q: %w", p.ConversationID, arbortype.ErrNotFound)
		}
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if p.TaskID != 0 {
		t, err := e.Store.GetTask(ctx, tx, p.TaskID)
		switch {
		case store.IsNoRows(err):
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d: %w", p.TaskID, arbortype.ErrNotFound)
		case err != nil:
			return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
		case t.ConversationID != p.ConversationID:
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d is in conversation %q, not %q: %w",
				p.TaskID, t.ConversationID, p.ConversationID, arbortype.ErrForeignTask)
		case t.Status.Settled():
			return arbortype.Budget{}, fmt.Errorf("set budget: task %d is %s: %w", p.TaskID, t.Status, arbortype.ErrSettled)
		}
	}
	// A raise wakes the parked tasks first: their rows are locked before
	// the budgets (budgets come last in every lock order). Max and action
	// change only under the conversation's lock, held here, so the reading
	// stands.
	rows, err := e.Store.ReadBudgets(ctx, tx, p.ConversationID, []string{p.Counter})
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	if i := slices.IndexFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == p.TaskID }); i >= 0 {
		old := rows[i]
		if p.Max > old.Max || (old.OnExhausted == arbortype.BudgetPark && p.OnExhausted != arbortype.BudgetPark) {
			if err := e.wakeBudgetParked(ctx, tx, p); err != nil {
				return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
			}
		}
	}
	row, err := e.setBudgetLocked(ctx, tx, p)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("set budget: %w", err)
	}
	return budget(row), nil
}

// setBudgetLocked writes a budget under the conversation's lock: the
// counter's budgets locked, the conversation's tally made when missing.
func (e *Engine) setBudgetLocked(ctx context.Context, tx pgx.Tx, p BudgetParams) (store.BudgetRow, error) {
	rows, err := e.Store.LockBudgets(ctx, tx, p.ConversationID, []string{p.Counter})
	if err != nil {
		return store.BudgetRow{}, err
	}
	if !slices.ContainsFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == 0 }) && p.TaskID != 0 {
		if _, _, err := e.Store.InsertBudget(ctx, tx, store.BudgetRow{ConversationID: p.ConversationID, Counter: p.Counter,
			Max: arbortype.Unlimited, OnExhausted: arbortype.BudgetFail}); err != nil {
			return store.BudgetRow{}, mapDBError(err)
		}
	}
	want := store.BudgetRow{ConversationID: p.ConversationID, TaskID: p.TaskID, Counter: p.Counter, Max: p.Max, OnExhausted: p.OnExhausted}
	i := slices.IndexFunc(rows, func(b store.BudgetRow) bool { return b.TaskID == p.TaskID })
	if i < 0 {
		row, _, err := e.Store.InsertBudget(ctx, tx, want)
		return row, mapDBError(err)
	}
	row, err := e.Store.UpdateBudget(ctx, tx, want)
	return row, mapDBError(err)
}

// wakeBudgetParked emits BudgetEvent to every task of the conversation
// parked on it (each reserves again when it runs; one still over parks
// again).
func (e *Engine) wakeBudgetParked(ctx context.Context, tx pgx.Tx, b BudgetParams) error {
	parked, err := e.Store.PendingAwaits(ctx, tx, b.ConversationID)
	if err != nil {
		return err
	}
	payload, err := json.Marshal(map[string]any{"counter": b.Counter, "task_id": b.TaskID, "max": budgetMax(b.Max)})
	if err != nil {
		return err
	}
	for _, t := range parked {
		if t.AwaitName != arbortype.BudgetEvent {
			continue
		}
		if _, err := e.Emit(ctx, tx, EmitParams{ConversationID: b.ConversationID, TaskID: t.ID,
			Name: arbortype.BudgetEvent, Payload: payload, Queue: true}); err != nil {
			return err
		}
	}
	return nil
}

func budgetMax(m int64) any {
	if m == arbortype.Unlimited {
		return nil
	}
	return m
}

// ApplyCreateBudgets sets the budgets of the tasks just created (ts[i]
// from ps[i]; the conversations are locked by the create): each
// ConversationBudgets entry where the conversation has no budget of the
// counter, then each task's Budgets. Tasks that existed already (created
// false: an idempotency key's repeat) are left as they are.
func (e *Engine) ApplyCreateBudgets(ctx context.Context, tx pgx.Tx, ps []CreateParams, ts []Task, created []bool) error {
	for i, p := range ps {
		if !created[i] || !p.HasBudgets() {
			continue
		}
		for _, b := range p.ConversationBudgets {
			rows, err := e.Store.LockBudgets(ctx, tx, p.ConversationID, []string{b.Counter})
			if err != nil {
				return err
			}
			if slices.ContainsFunc(rows, func(r store.BudgetRow) bool { return r.TaskID == 0 }) {
				continue
			}
			if _, err := e.setBudgetLocked(ctx, tx, limitParams(p.ConversationID, 0, b)); err != nil {
				return err
			}
		}
		for _, b := range p.Budgets {
			if _, err := e.setBudgetLocked(ctx, tx, limitParams(p.ConversationID, ts[i].ID, b)); err != nil {
				return err
			}
		}
	}
	return nil
}

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
// the package comment above). The error of a budget over is a
// *arbortype.BudgetExhaustedError (ErrBudgetExhausted).
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
		over, _, err := e.overBudget(ctx, tx, rt.ConversationID, chain, rows, p.Counter, p.Amount)
		if err != nil {
			return ReserveResult{}, err
		}
		if over != nil && over.Budget.OnExhausted != arbortype.BudgetReturn {
			if err := e.endOnExhausted(ctx, tx, held, p.Token, over); err != nil {
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
	scopes := scopeIDs(chain)
	over, known, err := e.overBudget(ctx, tx, rt.ConversationID, chain, rows, p.Counter, p.Amount)
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
		RunToken: p.Token, IdempotencyKey: p.Key, Amount: p.Amount}
	held2, spent := -p.Amount, int64(0)
	if p.Spend {
		r.Actual = &p.Amount
		held2, spent = 0, p.Amount
	}
	if err := e.Store.ChargeBudgets(ctx, tx, rt.ConversationID, p.Counter, scopes, held2, spent); err != nil {
		return ReserveResult{}, mapDBError(err)
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
func (e *Engine) endOnExhausted(ctx context.Context, tx pgx.Tx, t Task, token int64, over *arbortype.BudgetExhaustedError) error {
	if over.Budget.OnExhausted == arbortype.BudgetPark {
		_, err := e.AwaitEvent(ctx, tx, t.ID, token, AwaitParams{Name: arbortype.BudgetEvent, Phase: t.Phase, State: t.State})
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
// wall-time budgets; it returns the first one over, and whether any
// budget of the counter exists in the conversation.
func (e *Engine) overBudget(ctx context.Context, tx pgx.Tx, conv string, chain []store.ScopeNode, rows []store.BudgetRow, counter string, amount int64) (*arbortype.BudgetExhaustedError, bool, error) {
	find := func(c string, scope int64) *store.BudgetRow {
		for i := range rows {
			if rows[i].Counter == c && rows[i].TaskID == scope {
				return &rows[i]
			}
		}
		return nil
	}
	known := slices.ContainsFunc(rows, func(b store.BudgetRow) bool { return b.Counter == counter })
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
	return nil, known, nil
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
	return mapDBError(e.Store.ChargeBudgets(ctx, tx, r.ConversationID, r.Counter, scopes, r.Amount, actual))
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

// OverWallTime lists up to limit live tasks under a "fail" wall-time
// budget that is over.
func (e *Engine) OverWallTime(ctx context.Context, db store.DB, limit int) ([]int64, error) {
	return e.Store.OverWallTime(ctx, db, limit)
}

// ExpireWallTime fails taskID, code budget_exhausted, if it is live under
// a "fail" wall-time budget that is over (its own, an owner's or its
// conversation's); its foreground subtree is aborted first, as a
// deadline's.
func (e *Engine) ExpireWallTime(ctx context.Context, tx pgx.Tx, taskID int64) (bool, error) {
	t, err := e.lockConversationOf(ctx, tx, taskID)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	if t.Status.Settled() {
		return false, nil
	}
	chain, err := e.Store.ScopeChain(ctx, tx, t.ConversationID, taskID)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	rows, err := e.Store.LockBudgets(ctx, tx, t.ConversationID, []string{arbortype.CounterWallTime})
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	over, _, err := e.overBudget(ctx, tx, t.ConversationID, chain, rows, arbortype.CounterWallTime, 0)
	if err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	if over == nil || over.Budget.OnExhausted != arbortype.BudgetFail {
		return false, nil
	}
	te := &TaskError{Code: arbortype.CodeBudgetExhausted, NonRetryable: true, Message: over.Error()}
	if err := e.expireLocked(ctx, tx, t, te); err != nil {
		return false, errorf("expire wall time", taskID, err)
	}
	return true, nil
}

// Budgets reads every budget of a conversation (wall-time budgets with the
// time elapsed as their spend) and each task's own spend.
func (e *Engine) Budgets(ctx context.Context, db store.DB, conv string) ([]arbortype.Budget, []store.TaskSpend, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return nil, nil, fmt.Errorf("budgets: %w", err)
	}
	rows, err := e.Store.ConversationBudgets(ctx, db, conv)
	if err != nil {
		return nil, nil, fmt.Errorf("budgets of %q: %w", conv, err)
	}
	spend, err := e.Store.SpendByTask(ctx, db, conv)
	if err != nil {
		return nil, nil, fmt.Errorf("budgets of %q: %w", conv, err)
	}
	out := make([]arbortype.Budget, len(rows))
	for i, b := range rows {
		out[i] = budget(b)
	}
	return out, spend, nil
}

// Budget reads the budget of counter of one scope of conv: the
// conversation's (taskID 0) or a task's. No such budget is ErrNotFound,
// saying whether the conversation exists.
func (e *Engine) Budget(ctx context.Context, db store.DB, conv string, taskID int64, counter string) (arbortype.Budget, error) {
	if err := checkText("conversation id", conv, true); err != nil {
		return arbortype.Budget{}, fmt.Errorf("budget: %w", err)
	}
	what := fmt.Sprintf("budget %q of conversation %q", counter, conv)
	if taskID != 0 {
		what = fmt.Sprintf("budget %q of task %d of conversation %q", counter, taskID, conv)
	}
	rows, err := e.Store.ConversationBudgets(ctx, db, conv)
	if err != nil {
		return arbortype.Budget{}, fmt.Errorf("%s: %w", what, err)
	}
	for _, b := range rows {
		if b.TaskID == taskID && b.Counter == counter {
			return budget(b), nil
		}
	}
	if _, err := e.Store.GetConversation(ctx, db, conv); err != nil {
		if store.IsNoRows(err) {
			return arbortype.Budget{}, fmt.Errorf("%s: no such conversation: %w", what, arbortype.ErrNotFound)
		}
		return arbortype.Budget{}, fmt.Errorf("%s: %w", what, err)
	}
	return arbortype.Budget{}, fmt.Errorf("%s: none is set: %w", what, arbortype.ErrNotFound)
}

func budget(b store.BudgetRow) arbortype.Budget {
	return arbortype.Budget{ConversationID: b.ConversationID, TaskID: b.TaskID, Counter: b.Counter, Max: b.Max,
		Spent: b.Spent, Reserved: b.Reserved, Pruned: b.Carried, OnExhausted: b.OnExhausted, UpdatedAt: b.UpdatedAt}
}
