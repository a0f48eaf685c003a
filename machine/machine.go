package machine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/tasks"
)

// machine runs one conversation while this node holds its lease.
type machine struct {
	r     *Runner
	lease core.Lease
	kick  chan struct{}
	done  chan struct{}

	ctx    context.Context // ends when the machine stops
	cancel context.CancelCauseFunc

	// releasing is set when the machine starts giving its lease up: the
	// renew loop leaves it alone from then on (a missing renewal is then
	// the release, not a take-over).
	releasing   atomic.Bool
	releaseOnce sync.Once

	mu   sync.Mutex
	runs map[int64]*active
	wg   sync.WaitGroup
}

type active struct {
	run *Run
	// token and kind are copied at the start: the handler's goroutine owns
	// run.Task and may replace it.
	token  int64
	kind   string
	cancel context.CancelCauseFunc
	warned bool
}

func newMachine(r *Runner, lease core.Lease) *machine {
	ctx, cancel := context.WithCancelCause(r.runCtx)
	return &machine{r: r, lease: lease, kick: make(chan struct{}, 1), done: make(chan struct{}),
		ctx: ctx, cancel: cancel, runs: map[int64]*active{}}
}

func (m *machine) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *machine) logger() *slog.Logger {
	return m.r.logger.With(slog.String("conversation_id", m.lease.ConversationID), slog.Int64("epoch", m.lease.Epoch))
}

// loop claims and runs the conversation's tasks until the conversation is
// idle for IdleRelease, the lease is lost, or the runner stops. A machine
// that found work but no free worker slot is not idle: it waits for a slot.
func (m *machine) loop() {
	defer close(m.done)
	defer m.r.forget(m)
	tick := time.NewTicker(m.r.cfg.PollInterval)
	defer tick.Stop()
	idleSince := time.Now()
	for {
		m.checkRuns()
		m.r.mu.Lock()
		stopping := m.r.stopping
		m.r.mu.Unlock()
		claimed, starved := 0, false
		if !stopping && m.ctx.Err() == nil {
			n, st, err := m.claimAndRun()
			if errors.Is(err, tasks.ErrLeaseLost) {
				m.logger().Warn("arbor: conversation taken over; machine stops")
				m.cancel(errConversationLost)
			} else if err != nil && m.ctx.Err() == nil {
				m.logger().Warn("arbor: claiming tasks failed", slog.String("error", err.Error()))
			}
			claimed, starved = n, st
		}
		if m.busy() > 0 || claimed > 0 || starved {
			idleSince = time.Now()
		}
		if m.ctx.Err() != nil || ((stopping || time.Since(idleSince) >= m.r.cfg.IdleRelease) && m.busy() == 0) {
			m.wg.Wait()
			m.release()
			return
		}
		select {
		case <-m.ctx.Done():
		case <-m.kick:
		case <-tick.C:
		}
	}
}

func (m *machine) busy() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.runs)
}

// release frees the lease, once: fenced by the epoch (a lease already taken
// over is left alone), and recovering any task still running under it in
// the same transaction, so that no handler of this machine writes after it.
func (m *machine) release() {
	m.releaseOnce.Do(func() {
		m.releasing.Store(true)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.r.runCtx), 10*time.Second)
		defer cancel()
		rep, err := release(ctx, m.r.core, m.lease)
		switch {
		case errors.Is(err, tasks.ErrLeaseLost):
		case err != nil:
			m.logger().Warn("arbor: releasing the conversation failed; its lease will expire", slog.String("error", err.Error()))
		case !rep.Empty():
			m.logger().Info("arbor: released the conversation with tasks still running; they were recovered", slog.Any("report", rep))
		}
		m.cancel(context.Canceled)
	})
}

// checkRuns cancels the handlers whose task is no longer theirs (aborted,
// cancelled, taken over), and applies the watchdog.
func (m *machine) checkRuns() {
	m.mu.Lock()
	ids := make([]int64, 0, len(m.runs))
	for id := range m.runs {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	states, err := m.r.core.Store.RunStates(m.ctx, m.r.core.Pool, ids)
	if err != nil {
		return
	}
	now := time.Now()
	lease := m.r.core.Cfg.TaskLease
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range states {
		a := m.runs[st.ID]
		if a == nil {
			continue
		}
		if st.Status != arbortype.StatusRunning || st.Token != a.token {
			a.cancel(ErrTaskStopped)
			continue
		}
		deadline := a.run.leaseDeadline()
		switch {
		case now.After(deadline.Add(lease)):
			m.logger().Warn("arbor: handler blocked past twice its task lease; cancelling it",
				slog.Int64("task_id", st.ID), slog.String("kind", a.kind))
			a.cancel(ErrBlocked)
		case now.After(deadline) && !a.warned:
			a.warned = true
			m.logger().Warn("arbor: handler ran past its task lease without a checkpoint or heartbeat",
				slog.Int64("task_id", st.ID), slog.String("kind", a.kind))
		}
	}
}

// maxClaim is the most tasks one machine claims at once: a machine holds
// the slots it claims for while its claim runs, and must not hold all of a
// busy node's.
const maxClaim = 32

// claimAndRun claims as many runnable tasks as it can get worker slots for
// (at most maxClaim) and starts their handlers. It returns how many it
// started, and starved when it had no slot to claim with (it is poked when
// one is given back).
func (m *machine) claimAndRun() (n int, starved bool, err error) {
	free := 0
	for free < maxClaim {
		select {
		case m.r.slots <- struct{}{}:
			free++
			continue
		default:
		}
		break
	}
	if free == 0 {
		m.r.starve(m)
		return 0, true, nil
	}
	claimed, err := core.Tx(m.ctx, m.r.core, func(tx pgx.Tx) ([]arbortype.Task, error) {
		roots, err := m.r.core.Store.LiveRoots(m.ctx, tx, m.lease.ConversationID)
		if err != nil {
			return nil, err
		}
		return m.r.core.Claim(m.ctx, tx, m.lease, core.ClaimParams{
			Kinds: m.r.kinds, Roots: generations(roots, m.r.isGen), Limit: free})
	})
	m.r.releaseSlots(free - len(claimed))
	if err != nil {
		return 0, false, err
	}
	for _, t := range claimed {
		m.start(t)
	}
	return len(claimed), false, nil
}

// start runs a claimed task's handler on a worker slot already taken.
func (m *machine) start(t arbortype.Task) {
	ctx, cancel := context.WithCancelCause(m.ctx)
	run := newRun(m.r.core, t)
	m.mu.Lock()
	m.runs[t.ID] = &active{run: run, token: t.Token, kind: t.Kind, cancel: cancel}
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.execute(ctx, run)
		m.mu.Lock()
		delete(m.runs, t.ID)
		m.mu.Unlock()
		cancel(context.Canceled)
		m.r.releaseSlots(1)
		m.poke() // what this run ended may make more work runnable
	}()
}

// execute runs the handler and ends its run for it when it did not: nil
// completes the task with no result, an error of the handler's fails it,
// and an error that says the run is over (or a context cut by a stop, a
// shutdown or a lost lease) writes nothing.
func (m *machine) execute(ctx context.Context, run *Run) {
	t := run.Task
	log := m.logger().With(slog.Int64("task_id", t.ID), slog.String("kind", t.Kind), slog.Int("attempt", t.Attempt))
	err := callHandler(ctx, m.r.handlers[t.Kind], run)
	if run.Ended() {
		return
	}
	if err == nil {
		if cerr := run.Complete(ctx, nil); cerr != nil && !run.Ended() {
			log.Warn("arbor: completing the task failed", slog.String("error", cerr.Error()))
		}
		return
	}
	if runOver(err) {
		return
	}
	if cause := context.Cause(ctx); cause != nil &&
		(errors.Is(cause, ErrTaskStopped) || errors.Is(cause, ErrShutdown) || errors.Is(cause, tasks.ErrLeaseLost)) {
		// Stopped elsewhere: nothing to write. Cut by a shutdown or a lost
		// lease: not the handler's failure; the task stays running and the
		// conversation's next holder (or this release) recovers it.
		return
	}
	if ferr := run.fail(ctx, err); ferr != nil && !runOver(ferr) {
		log.Warn("arbor: failing the task failed", slog.String("error", ferr.Error()), slog.String("handler_error", err.Error()))
	}
}
