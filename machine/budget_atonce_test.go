package machine_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// countedKey marks the context of the calls whose statements a
// statementTracer counts. A run's writes keep their caller's context
// values (they are detached from its cancellation only), so a lease's
// renewals and everything else on the pool are left out.
type countedKey struct{}

// statementTracer keeps the SQL of every statement, and of every batch
// (one round trip each, as the bench's counters count them), sent under a
// context marked with countedKey.
type statementTracer struct {
	mu  sync.Mutex
	sql []string
}

func (c *statementTracer) note(ctx context.Context, sql string) {
	if ctx.Value(countedKey{}) == nil {
		return
	}
	c.mu.Lock()
	c.sql = append(c.sql, sql)
	c.mu.Unlock()
}

func (c *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.note(ctx, d.SQL)
	return ctx
}

func (c *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.note(ctx, "(batch)")
	return ctx
}

func (c *statementTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *statementTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// sent runs f with a counted context and returns the statements it sent.
func (c *statementTracer) sent(ctx context.Context, f func(ctx context.Context)) []string {
	c.mu.Lock()
	c.sql = nil
	c.mu.Unlock()
	f(context.WithValue(ctx, countedKey{}, true))
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sql
}

// On the common path — every budget above the task has room, no
// reservation of the counter is left by a run that is over — Run.Reserve,
// Run.Record, Run.Spend and Run.ReleaseReservation send one statement
// each, which commits on its own (issue 20: a reservation and its record
// were 18 statements in two transactions). The task is a tool under a
// sub-agent under a turn, with three budgets above it, as in bench (j).
func TestBudgetCommonPathIsOneStatementEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tracer := &statementTracer{}
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)

	limit := []arbortype.BudgetLimit{{Counter: "tokens", Max: 10_000}}
	turn, _, err := eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Budgets: limit, ConversationBudgets: limit})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, eng, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	turnRun, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	agent, err := turnRun.Spawn(b.ctx, machine.SpawnParams{Kind: "agent", Budgets: limit})
	require.NoError(t, err)
	agentRun, err := lease.Start(b.ctx, agent.ID)
	require.NoError(t, err)
	tool, err := agentRun.Spawn(b.ctx, machine.SpawnParams{Kind: "tool"})
	require.NoError(t, err)
	run, err := lease.Start(b.ctx, tool.ID)
	require.NoError(t, err)

	one := func(what string, f func(ctx context.Context) error) {
		t.Helper()
		sql := tracer.sent(b.ctx, func(ctx context.Context) { require.NoError(t, f(ctx), what) })
		require.Len(t, sql, 1, "%s: one statement, no transaction around it: %q", what, sql)
	}
	var res, again arbortype.Reservation
	one("reserve", func(ctx context.Context) (err error) { res, err = run.Reserve(ctx, "tokens", 100); return err })
	require.Equal(t, arbortype.Reservation{ID: res.ID, TaskID: tool.ID, Counter: "tokens", Amount: 100}, res)
	for _, scope := range []int64{0, turn.ID, agent.ID} {
		got := b.budgetOf(t, scope, "tokens")
		require.Equal(t, [2]int64{0, 100}, [2]int64{got.Spent, got.Reserved}, "scope %d: held after the reserve", scope)
	}
	one("record", func(ctx context.Context) error { return run.Record(ctx, res, 60) })
	one("the same record again", func(ctx context.Context) error { return run.Record(ctx, res, 60) })
	one("spend", func(ctx context.Context) error { return run.Spend(ctx, "tokens", 7) })
	one("reserve", func(ctx context.Context) (err error) { again, err = run.Reserve(ctx, "tokens", 500); return err })
	one("release", func(ctx context.Context) error { return run.ReleaseReservation(ctx, again) })
	for _, scope := range []int64{0, turn.ID, agent.ID} {
		got := b.budgetOf(t, scope, "tokens")
		require.Equal(t, [2]int64{67, 0}, [2]int64{got.Spent, got.Reserved}, "scope %d: spent and reserved at the end", scope)
	}

	// The refusals are one statement too, and write nothing.
	before := b.budgetRows(t)
	sql := tracer.sent(b.ctx, func(ctx context.Context) {
		require.ErrorIs(t, run.Record(ctx, res, 61), arbortype.ErrInvalidArgument, "recorded with another actual")
		require.ErrorIs(t, run.Record(ctx, arbortype.Reservation{ID: res.ID + 1000, TaskID: tool.ID}, 1), arbortype.ErrNotFound)
	})
	require.Len(t, sql, 2, "%q", sql)
	require.Equal(t, before, b.budgetRows(t))

	// A reservation over a budget leaves the common path: its statement
	// writes nothing, and the engine's transaction decides (the tool
	// fails, its budget's action).
	sql = tracer.sent(b.ctx, func(ctx context.Context) {
		_, err := run.Reserve(ctx, "tokens", 20_000)
		var over *arbortype.BudgetExhaustedError
		require.ErrorAs(t, err, &over)
		require.True(t, over.Ended)
	})
	require.Greater(t, len(sql), 1, "the rare path: %q", sql)
	require.Equal(t, arbortype.StatusFailed, b.status(t, tool.ID))
	require.NoError(t, agentRun.Complete(b.ctx, nil))
	require.NoError(t, turnRun.Complete(b.ctx, nil))
	b.requireClean(t)
}

// Many runs of one conversation reserve, record, spend and release at
// once, over and over, against budgets they share (the conversation's and
// their turn's, some sub-agents' of their own), with raises of the
// conversation's budget among them; half the runs end with reservations
// open, which the others' next reservations close in full. The common
// path and the rare ones (a budget over, lapses to close) interleave.
// Afterwards the invariant checker finds nothing (every budget is the sum
// of its scope's reservations, invariant 10), the lapsed reservations are
// exactly those the ended runs left open, and no reservation is left open.
func TestBudgetReserveRecordStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		rounds   = 40
		convMax  = 20_000
		raiseBy  = 500
		ownMax   = 3_000
		pairs    = 4 // agents, each with a tool under it
		maxAsked = 200
	)
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: arbortype.Unlimited}},
		ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: convMax, OnExhausted: arbortype.BudgetReturn},
			{Counter: "calls", Max: arbortype.Unlimited}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, b.engine.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	turnRun, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	var agents, tools []*machine.Run
	for i := range pairs {
		p := machine.SpawnParams{Kind: "agent"}
		if i%2 == 0 {
			p.Budgets = []arbortype.BudgetLimit{{Counter: "tokens", Max: ownMax, OnExhausted: arbortype.BudgetReturn}}
		}
		agent, err := turnRun.Spawn(b.ctx, p)
		require.NoError(t, err)
		agentRun, err := lease.Start(b.ctx, agent.ID)
		require.NoError(t, err)
		tool, err := agentRun.Spawn(b.ctx, machine.SpawnParams{Kind: "tool"})
		require.NoError(t, err)
		toolRun, err := lease.Start(b.ctx, tool.ID)
		require.NoError(t, err)
		agents, tools = append(agents, agentRun), append(tools, toolRun)
	}

	// work does rounds of random budget operations on run, seeded by seed,
	// and returns the reservations it left open. (No require in these
	// goroutines: a failure must not stop one holding locks the others
	// wait for.)
	var raises, refusals atomic.Int64
	work := func(run *machine.Run, seed uint64) []arbortype.Reservation {
		rng := rand.New(rand.NewPCG(seed, 20))
		var open []arbortype.Reservation
		// refused says whether the operation was refused: by a budget
		// that returns (the run goes on), or by a failure.
		refused := func(err error) bool {
			if errors.Is(err, arbortype.ErrBudgetExhausted) {
				var over *arbortype.BudgetExhaustedError
				assert.ErrorAs(t, err, &over)
				assert.False(t, over.Ended, "a budget that returns leaves the run going")
				refusals.Add(1)
				return true
			}
			return !assert.NoError(t, err)
		}
		for i := range rounds {
			n := rng.Int64N(maxAsked) + 1
			switch op := rng.IntN(10); {
			case op < 5: // reserve, then record about what it cost
				res, err := run.Reserve(b.ctx, "tokens", n)
				if !refused(err) {
					assert.NoError(t, run.Record(b.ctx, res, rng.Int64N(n+50)))
				}
			case op < 7:
				refused(run.Spend(b.ctx, "tokens", n))
			case op == 7:
				res, err := run.Reserve(b.ctx, "tokens", n)
				if !refused(err) {
					assert.NoError(t, run.ReleaseReservation(b.ctx, res))
				}
			case op == 8: // held for later
				res, err := run.Reserve(b.ctx, "tokens", n)
				if !refused(err) {
					open = append(open, res)
				}
			case len(open) > 0:
				assert.NoError(t, run.Record(b.ctx, open[0], open[0].Amount))
				open = open[1:]
			}
			if i%10 == 9 {
				_, err := b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens",
					Max: convMax + raiseBy*raises.Add(1), OnExhausted: arbortype.BudgetReturn})
				assert.NoError(t, err)
			}
		}
		return open
	}

	// The tools work beside the agents and end, each leaving a reservation
	// of calls open (and whatever else of tokens it held); then each agent
	// works on, its first reservation of each counter after the tools
	// ended closing what they left of it, beside the others' work.
	var (
		agentsWg, toolsWg sync.WaitGroup
		leftOpen          atomic.Int64
	)
	toolsDone := make(chan struct{})
	for i, run := range tools {
		toolsWg.Go(func() {
			open := work(run, uint64(100+i))
			if res, err := run.Reserve(b.ctx, "calls", 1); assert.NoError(t, err) {
				open = append(open, res)
			}
			leftOpen.Add(int64(len(open)))
			assert.NoError(t, run.Complete(b.ctx, nil))
		})
	}
	for i, run := range agents {
		agentsWg.Go(func() {
			open := work(run, uint64(i))
			<-toolsDone
			assert.NoError(t, run.Spend(b.ctx, "calls", 1))
			open = append(open, work(run, uint64(200+i))...)
			for _, res := range open {
				assert.NoError(t, run.Record(b.ctx, res, res.Amount/2))
			}
		})
	}
	toolsWg.Wait()
	close(toolsDone)
	agentsWg.Wait()
	require.False(t, t.Failed())

	// What the tools left open of tokens is closed by now only if a
	// reservation after they ended was granted (a refusal writes nothing,
	// the closes included): one more, with the conversation's budget made
	// a tally, makes sure of it (the agent has no budget of its own).
	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens", Max: arbortype.Unlimited})
	require.NoError(t, err)
	res, err := agents[1].Reserve(b.ctx, "tokens", 1)
	require.NoError(t, err)
	require.NoError(t, agents[1].Record(b.ctx, res, 1))
	var lapsed, stillOpen int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE lapsed), count(*) FILTER (WHERE actual IS NULL)
		FROM `+b.schema+`.budget_reservations WHERE conversation_id = $1`, b.conv).Scan(&lapsed, &stillOpen))
	require.Equal(t, leftOpen.Load(), lapsed, "exactly what the ended runs left open was closed in full")
	require.Zero(t, stillOpen)
	t.Logf("%d reservations closed in full after their runs ended, %d refused by a budget, %d raises", lapsed, refusals.Load(), raises.Load())
	for _, scope := range []int64{0, turn.ID} {
		require.Zero(t, b.budgetOf(t, scope, "tokens").Reserved)
	}
	require.Equal(t, int64(pairs*2), b.budgetOf(t, 0, "calls").Spent, "the tools' calls, spent in full, and the agents'")

	// Over the conversation's budget: refused, and the run goes on.
	_, err = b.engine.SetBudget(b.ctx, tasks.BudgetParams{ConversationID: b.conv, Counter: "tokens", Max: 1, OnExhausted: arbortype.BudgetReturn})
	require.NoError(t, err)
	_, err = agents[1].Reserve(b.ctx, "tokens", 2)
	var over *arbortype.BudgetExhaustedError
	require.ErrorAs(t, err, &over)
	require.Zero(t, over.Budget.TaskID, "the conversation's budget refuses")
	require.False(t, over.Ended)
	b.requireClean(t)

	for _, run := range agents {
		require.NoError(t, run.Complete(b.ctx, nil))
	}
	require.NoError(t, turnRun.Complete(b.ctx, nil))
	b.requireClean(t)
}

// The one-statement reservation and record work behind PgBouncer in
// transaction mode (each is a statement outside any transaction, which
// such a pooler runs on whichever server session it has).
func TestBudgetThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := setupBouncer(t, false, slog.New(slog.DiscardHandler)) // (its warning that nothing LISTENs is expected)
	eng := b.bounced
	turn, _, err := eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn",
		Budgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100, OnExhausted: arbortype.BudgetReturn}}})
	require.NoError(t, err)
	lease, err := machine.AcquireLease(b.ctx, eng.Engine, b.conv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	run, err := lease.Start(b.ctx, turn.ID)
	require.NoError(t, err)
	for range 3 {
		res, err := run.Reserve(b.ctx, "tokens", 30)
		require.NoError(t, err)
		require.NoError(t, run.Record(b.ctx, res, 20))
		require.NoError(t, run.Spend(b.ctx, "tokens", 5))
	}
	_, err = run.Reserve(b.ctx, "tokens", 30)
	require.ErrorIs(t, err, arbortype.ErrBudgetExhausted)
	got := b.budgetOf(t, turn.ID, "tokens")
	require.Equal(t, [2]int64{75, 0}, [2]int64{got.Spent, got.Reserved})
	require.NoError(t, run.Complete(b.ctx, nil))
	b.requireClean(t)
}
