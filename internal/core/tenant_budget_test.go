package core_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// tenantRun is a running turn in a conversation of a tenant.
type tenantRun struct {
	b   *bundle
	run arbortype.Task
	key int
}

// tenantTurn creates a conversation of tenant on b's schema (a bundle of
// its own) with one turn, and starts it.
func tenantTurn(t *testing.T, b *bundle, tenant string) *tenantRun {
	t.Helper()
	c := newBundle(t, b.pool, b.schema)
	turn, _, err := c.engine.Create(c.ctx, arbortype.CreateParams{ConversationID: c.conv, Kind: "turn", Tenant: tenant})
	require.NoError(t, err)
	return &tenantRun{b: c, run: c.start(t, turn.ID)}
}

func (r *tenantRun) reserve(counter string, amount int64, spend bool) (core.ReserveResult, error) {
	r.key++
	return r.b.engine.C.ReserveBudget(r.b.ctx, core.ReserveParams{ConversationID: r.b.conv, TaskID: r.run.ID, Token: r.run.Token,
		Counter: counter, Amount: amount, Key: fmt.Sprintf("k%d", r.key), Spend: spend})
}

func tenantBudgetOf(t *testing.T, b *bundle, tenant, counter string, window time.Duration) arbortype.Budget {
	t.Helper()
	bs, err := b.engine.TenantBudgets(b.ctx, tenant)
	require.NoError(t, err)
	for _, x := range bs {
		if x.Counter == counter && x.Window == window {
			return x
		}
	}
	t.Fatalf("no budget %s per %s of tenant %q", counter, window, tenant)
	return arbortype.Budget{}
}

// TestTenantBudgetSharedByConversations: a tenant's budget counts the
// reservations of every conversation of the tenant; the one that would
// take it over is refused (its action, return, leaves the run going) and
// writes nothing; a record gives back what was not spent. A counter only a
// tenant budget names is known.
func TestTenantBudgetSharedByConversations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := testdb.Conversation(t)
	got, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetReturn})
	require.NoError(t, err)
	require.Equal(t, tenant, got.Tenant)
	require.Empty(t, got.ConversationID)
	a, c := tenantTurn(t, b, tenant), tenantTurn(t, b, tenant)
	other := tenantTurn(t, b, tenant+"-other")

	ra, err := a.reserve("tokens", 60, false)
	require.NoError(t, err)
	before := c.b.snapshot(t)
	_, err = c.reserve("tokens", 50, false)
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.Equal(t, tenant, over.Budget.Tenant)
	require.EqualValues(t, 60, over.Budget.Reserved)
	require.False(t, over.Ended)
	require.Equal(t, before, c.b.snapshot(t), "nothing written")
	require.EqualValues(t, 60, tenantBudgetOf(t, b, tenant, "tokens", 0).Reserved)
	_, err = c.reserve("tokens", 40, false)
	require.NoError(t, err, "the rest of the tenant's budget")
	_, err = other.reserve("tokens", 1, false)
	require.ErrorIs(t, err, arbortype.ErrUnknownCounter, "another tenant's conversation is not counted, nor does it know the counter")

	_, err = a.b.engine.C.RecordBudget(a.b.ctx, a.b.pool, a.b.conv, a.run.ID, ra.Reservation.ID, 30)
	require.NoError(t, err)
	tb := tenantBudgetOf(t, b, tenant, "tokens", 0)
	require.EqualValues(t, 30, tb.Spent)
	require.EqualValues(t, 40, tb.Reserved)
	_, err = c.reserve("tokens", 30, true)
	require.NoError(t, err)
	_, err = a.reserve("tokens", 1, true)
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)

	bs, err := a.b.engine.Budgets(a.b.ctx, a.b.conv)
	require.NoError(t, err)
	require.Len(t, bs.Tenant, 1)
	require.EqualValues(t, 60, bs.Tenant[0].Spent)
	require.EqualValues(t, 40, bs.Tenant[0].Reserved)
}

// TestTenantBudgetNeverOvershoots: reservations racing from many
// conversations of one tenant take exactly what its budget allows.
//
// Then the runs end without recording what they hold: the sweep closes
// their reservations in full, on the tenant's budget too, and the checker
// finds every sum right.
func TestTenantBudgetNeverOvershoots(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	tenant := testdb.Conversation(t)
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "calls", Max: 25, OnExhausted: arbortype.BudgetReturn})
	require.NoError(t, err)
	const convs, each = 8, 10
	runs := make([]*tenantRun, convs)
	for i := range runs {
		runs[i] = tenantTurn(t, b, tenant)
		if i%2 == 0 {
			// Half of them under a conversation budget of their own too.
			_, err := b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: runs[i].b.conv, Counter: "calls", Max: arbortype.Unlimited})
			require.NoError(t, err)
		}
	}
	var mu sync.Mutex
	taken, refused := 0, 0
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				_, err := r.reserve("calls", 1, r.key%2 == 0)
				mu.Lock()
				switch {
				case err == nil:
					taken++
				case errors.Is(err, arbortype.ErrBudgetExhausted):
					refused++
				default:
					t.Errorf("reserve: %v", err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 25, taken)
	require.Equal(t, convs*each-25, refused)
	tb := tenantBudgetOf(t, b, tenant, "calls", 0)
	require.EqualValues(t, 25, tb.Spent+tb.Reserved)
	require.NotZero(t, tb.Reserved, "some are open")
	requireAllInvariants(t, b)

	for _, r := range runs {
		_, err := r.b.engine.Complete(r.b.ctx, r.run.ID, r.run.Token, nil)
		require.NoError(t, err)
		_, err = core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) (struct{}, error) {
			return struct{}{}, b.engine.C.SweepLapsed(b.ctx, tx, r.b.conv, "calls")
		})
		require.NoError(t, err)
	}
	tb = tenantBudgetOf(t, b, tenant, "calls", 0)
	require.EqualValues(t, 25, tb.Spent, "spent in full once their runs are over")
	require.Zero(t, tb.Reserved)
	requireAllInvariants(t, b)
}

// moveWindowBack moves a tenant budget's window back by one, as the clock
// moving on would: the test plays the clock (the guard refuses a window
// moved back, so its trigger is off for this one statement's
// transaction, which holds the table's lock throughout).
func moveWindowBack(t *testing.T, b *bundle, tenant, counter string) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	tbl := pgx.Identifier{b.schema, "tenant_budgets"}.Sanitize()
	_, err = tx.Exec(b.ctx, `ALTER TABLE `+tbl+` DISABLE TRIGGER "Arbor_tenant_budget_guard_update"`)
	require.NoError(t, err)
	tag, err := tx.Exec(b.ctx, `UPDATE `+tbl+` SET window_start = window_start - ('1 ' || window_unit)::interval
		WHERE tenant = $1 AND counter = $2 AND window_unit <> ''`, tenant, counter)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = tx.Exec(b.ctx, `ALTER TABLE `+tbl+` ENABLE TRIGGER "Arbor_tenant_budget_guard_update"`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
}

// TestTenantWindowRollsOver: a per-day budget refuses what its window
// has no room for; once the window is over, the spend starts again from
// 0 while a reservation still open keeps holding its room (carried into
// the new window), and its close counts in the window it closes in.
func TestTenantWindowRollsOver(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	tenant := testdb.Conversation(t)
	// A day: the test does not straddle a window's end but at 00:00 UTC.
	set, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "calls", Max: 10, Window: 24 * time.Hour,
		OnExhausted: arbortype.BudgetReturn})
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, set.Window)
	require.Equal(t, set.WindowStart.UTC().Truncate(24*time.Hour), set.WindowStart.UTC(), "calendar-aligned: 00:00 UTC")
	for _, w := range []time.Duration{time.Minute, time.Hour} {
		s, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "other", Max: 10, Window: w})
		require.NoError(t, err)
		require.Equal(t, w, s.Window)
		require.Equal(t, s.WindowStart.Truncate(w), s.WindowStart, "a window starts at a whole %s", w)
	}
	r := tenantTurn(t, b, tenant)
	_, err = r.reserve("calls", 6, true)
	require.NoError(t, err)
	open, err := r.reserve("calls", 4, false)
	require.NoError(t, err)
	_, err = r.reserve("calls", 1, true)
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted, "the window is full")

	moveWindowBack(t, b, tenant, "calls")
	read := tenantBudgetOf(t, b, tenant, "calls", 24*time.Hour)
	require.Zero(t, read.Spent, "a window over reads as the current one, nothing spent in it")
	require.EqualValues(t, 4, read.Reserved, "the open reservation is carried")
	_, err = r.reserve("calls", 6, true)
	require.NoError(t, err, "the new window allows again")
	_, err = r.reserve("calls", 1, true)
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted, "6 spent and 4 held in the new window")
	_, err = r.b.engine.C.RecordBudget(r.b.ctx, r.b.pool, r.b.conv, r.run.ID, open.Reservation.ID, 3)
	require.NoError(t, err)
	tb := tenantBudgetOf(t, b, tenant, "calls", 24*time.Hour)
	require.EqualValues(t, 9, tb.Spent)
	require.Zero(t, tb.Reserved)
	require.True(t, tb.WindowStart.Equal(set.WindowStart), "the window rolled to the current one")
	// (No check across conversations here: the test moved the window back,
	// so the closes before it fall in "its" window for the checker.)
}

// requireAllInvariants checks every conversation of b's schema (a schema
// of the test's own), and the tenant budgets across them.
func requireAllInvariants(t *testing.T, b *bundle) {
	t.Helper()
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// TestTenantBudgetGuardAndChecker: the guard refuses a tenant budget's
// spend brought down within its window, a window moved back and a delete
// (AB009); the checker reports a reserved that its open reservations do
// not explain (the guard leaves reserved to the checker).
func TestTenantBudgetGuardAndChecker(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	tenant := testdb.Conversation(t)
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "calls", Max: 10, Window: time.Hour})
	require.NoError(t, err)
	r := tenantTurn(t, b, tenant)
	_, err = r.reserve("calls", 3, true)
	require.NoError(t, err)
	requireAllInvariants(t, b)
	tbl := pgx.Identifier{b.schema, "tenant_budgets"}.Sanitize()
	for what, forgery := range map[string]string{
		"spend down":  `UPDATE ` + tbl + ` SET spent = 0 WHERE tenant = $1`,
		"window back": `UPDATE ` + tbl + ` SET window_start = window_start - interval '1 hour', spent = 0 WHERE tenant = $1`,
		"delete":      `DELETE FROM ` + tbl + ` WHERE tenant = $1`,
	} {
		_, err := b.pool.Exec(b.ctx, forgery, tenant)
		require.ErrorContains(t, err, "AB009", what)
	}
	_, err = b.pool.Exec(b.ctx, `UPDATE `+tbl+` SET reserved = 5 WHERE tenant = $1`, tenant)
	require.NoError(t, err)
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	require.Equal(t, 10, vs[0].Invariant)
	require.Contains(t, vs[0].Message, tenant)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+tbl+` SET reserved = 0 WHERE tenant = $1`, tenant)
	require.NoError(t, err)
}

// TestTenantBudgetActions: fail fails the task (code budget_exhausted);
// park on a windowed budget parks it awaiting arbor:budget until the
// window's end, when it runs again and reserves anew.
func TestTenantBudgetActions(t *testing.T) {
	t.Parallel()
	b := setupTruncating(t)
	tenant := testdb.Conversation(t)
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 5, OnExhausted: arbortype.BudgetFail})
	require.NoError(t, err)
	_, err = b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "calls", Max: 1, Window: 24 * time.Hour,
		OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)

	f := tenantTurn(t, b, tenant)
	_, err = f.reserve("tokens", 6, false)
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.True(t, over.Ended)
	failed := f.b.get(t, f.run.ID)
	require.Equal(t, arbortype.StatusFailed, failed.Status)
	require.Equal(t, arbortype.CodeBudgetExhausted, failed.Error.Code)

	p := tenantTurn(t, b, tenant)
	_, err = p.reserve("calls", 1, true)
	require.NoError(t, err)
	_, err = p.reserve("calls", 1, true)
	require.ErrorAs(t, err, &over)
	require.True(t, over.Ended)
	require.Equal(t, 24*time.Hour, over.Budget.Window)
	parked := p.b.get(t, p.run.ID)
	require.Equal(t, arbortype.StatusSleeping, parked.Status)
	require.Equal(t, arbortype.BudgetEvent, parked.AwaitName)
	require.NotNil(t, parked.WakeAt, "a park on a windowed budget times out")
	end := over.Budget.WindowStart.Add(24 * time.Hour)
	require.False(t, parked.WakeAt.Before(end), "not before the window's end")
	require.True(t, parked.WakeAt.Before(end.Add(time.Second)), "at the window's end")
	_, err = p.b.engine.WakeSleeping(p.b.ctx, parked.ID, parked.SleepSeq)
	var notDue *core.NotDueError
	require.ErrorAs(t, err, &notDue, "the timeout is the window's end, not now")

	// The window ends: the clock moves on (the window, back by one), and
	// the await's timeout wakes the task (WakeNow makes the same
	// sleeping → pending edge the timeout's wake makes, without waiting an
	// day); it runs again from its checkpoint and reserves anew.
	moveWindowBack(t, b, tenant, "calls")
	_, err = p.b.engine.WakeNow(p.b.ctx, parked.ID)
	require.NoError(t, err)
	p.run = p.b.start(t, parked.ID)
	_, err = p.reserve("calls", 1, true)
	require.NoError(t, err, "the new window allows")
	_, err = p.b.engine.Complete(p.b.ctx, p.run.ID, p.run.Token, nil)
	require.NoError(t, err)
}

// TestTenantBudgetRaiseWakesParked: raising a tenant's budget emits
// arbor:budget to the tasks parked on it in every conversation of the
// tenant; a change that is no raise wakes nobody.
func TestTenantBudgetRaiseWakesParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := testdb.Conversation(t)
	_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 10, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	runs := []*tenantRun{tenantTurn(t, b, tenant), tenantTurn(t, b, tenant)}
	for _, r := range runs {
		_, err := r.reserve("tokens", 11, false)
		require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)
		parked := r.b.get(t, r.run.ID)
		require.Equal(t, arbortype.StatusSleeping, parked.Status)
		require.Nil(t, parked.WakeAt, "no window: parked until a raise")
	}
	_, err = b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 5, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	for _, r := range runs {
		require.Equal(t, arbortype.StatusSleeping, r.b.get(t, r.run.ID).Status, "a lower max wakes nobody")
	}
	_, err = b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark})
	require.NoError(t, err)
	for _, r := range runs {
		woken := r.b.get(t, r.run.ID)
		require.Equal(t, arbortype.StatusPending, woken.Status, "the raise woke it")
		r.run = r.b.start(t, woken.ID)
		_, err := r.reserve("tokens", 11, false)
		require.NoError(t, err)
		_, err = r.b.engine.Complete(r.b.ctx, r.run.ID, r.run.Token, nil)
		require.NoError(t, err)
	}
}

// TestTenantBudgetBadInput: an unknown window, a negative max, a tenant
// over 200 bytes, a window on a conversation's budget, a tenant and a
// conversation at once, and a tenant's wall-time budget are
// ErrInvalidArgument, and nothing is written.
func TestTenantBudgetBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := testdb.Conversation(t)
	r := tenantTurn(t, b, tenant)
	type bad struct {
		tenant *string // a tenant's budget (SetTenantBudget), or nil (SetBudget)
		p      tasks.BudgetParams
	}
	long := strings.Repeat("t", 201)
	for name, c := range map[string]bad{
		"window":            {&tenant, tasks.BudgetParams{Counter: "tokens", Max: 1, Window: 2 * time.Minute}},
		"negative window":   {&tenant, tasks.BudgetParams{Counter: "tokens", Max: 1, Window: -time.Minute}},
		"negative max":      {&tenant, tasks.BudgetParams{Counter: "tokens", Max: -1}},
		"long tenant":       {&long, tasks.BudgetParams{Counter: "tokens", Max: 1}},
		"conversation too":  {&tenant, tasks.BudgetParams{ConversationID: r.b.conv, Counter: "tokens", Max: 1}},
		"conversation rate": {nil, tasks.BudgetParams{ConversationID: r.b.conv, Counter: "tokens", Max: 1, Window: time.Hour}},
		"no conversation":   {nil, tasks.BudgetParams{Counter: "tokens", Max: 1}},
		"wall time":         {&tenant, tasks.BudgetParams{Counter: arbortype.CounterWallTime, Max: 1}},
		"task, no conv":     {&tenant, tasks.BudgetParams{TaskID: r.run.ID, Counter: "tokens", Max: 1}},
		"action":            {&tenant, tasks.BudgetParams{Counter: "tokens", Max: 1, OnExhausted: "sulk"}},
	} {
		before := r.b.snapshot(t)
		var err error
		if c.tenant != nil {
			_, err = b.engine.SetTenantBudget(b.ctx, *c.tenant, c.p)
		} else {
			_, err = b.engine.SetBudget(b.ctx, c.p)
		}
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, name)
		require.Equal(t, before, r.b.snapshot(t), name)
	}
	bs, err := b.engine.TenantBudgets(b.ctx, tenant)
	require.NoError(t, err)
	require.Empty(t, bs, "nothing written")
	cb, err := b.engine.Budgets(b.ctx, r.b.conv)
	require.NoError(t, err)
	require.Empty(t, cb.Budgets)
	_, err = b.engine.TenantBudgets(b.ctx, strings.Repeat("t", 201))
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
}

// TestRaceTenantRaiseAndPark: a raise of a tenant's budget and a
// reservation that parks on it, racing on the conversation's lock in
// both orders: the park first is woken by the raise; the raise first is
// read by the reservation, which then fits. Never a task left parked
// under a budget that has room (a lost wake-up).
func TestRaceTenantRaiseAndPark(t *testing.T) {
	t.Parallel()
	for _, parkFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "park_first", false: "raise_first"}[parkFirst], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tenant := testdb.Conversation(t)
			_, err := b.engine.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 10, OnExhausted: arbortype.BudgetPark})
			require.NoError(t, err)
			turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Tenant: tenant})
			require.NoError(t, err)
			run := b.start(t, turn.ID)
			r := newRacer(t, b)
			reserve := func(e *enginetest.Engine) error {
				_, err := e.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token,
					Counter: "tokens", Amount: 50, Key: "k"})
				return err
			}
			raise := func(e *enginetest.Engine) error {
				_, err := e.SetTenantBudget(b.ctx, tenant, tasks.BudgetParams{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetPark})
				return err
			}
			r.hold()
			if parkFirst {
				r.queue(reserve)
				r.queue(raise)
			} else {
				r.queue(raise)
				r.queue(reserve)
			}
			errs := r.release()
			reserveErr, raiseErr := errs[0], errs[1]
			if !parkFirst {
				reserveErr, raiseErr = errs[1], errs[0]
			}
			require.NoError(t, raiseErr)
			got := b.get(t, run.ID)
			if parkFirst {
				var over *arbortype.BudgetExhaustedError
				require.ErrorAs(t, reserveErr, &over)
				require.True(t, over.Ended, "parked")
				require.Equal(t, arbortype.StatusPending, got.Status, "the raise woke it")
				return
			}
			require.NoError(t, reserveErr, "the reservation read the raise")
			require.Equal(t, arbortype.StatusRunning, got.Status)
			_, err = b.engine.Complete(b.ctx, run.ID, run.Token, nil)
			require.NoError(t, err)
		})
	}
}
