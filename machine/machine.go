package machine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// machine runs one conversation while this node holds its lease.
type machine struct {
	r     *Runner
	fence tasks.Fence
	kick  chan struct{}
	done  chan struct{}

	ctx    context.Context // ends when the machine stops
	cancel context.CancelCauseFunc

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

func newMachine(r *Runner, fence tasks.Fence) *machine {
	ctx, cancel := context.WithCancelCause(r.runCtx)
	return &machine{r: r, fence: fence, kick: make(chan struct{}, 1), done: make(chan struct{}),
		ctx: ctx, cancel: cancel, runs: map[int64]*active{}}
}

func (m *machine) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *machine) logger() *slog.Logger {
	return m.r.logger.With(slog.String("conversation_id", m.fence.ConversationID), slog.Int64("epoch", m.fence.Epoch))
}

// loop claims and runs the conversation's tasks until the conversation is
// idle for IdleRelease, the lease is lost, or the runner stops.
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
		claimed := 0
		if !stopping && m.ctx.Err() == nil {
			n, err := m.claimAndRun()
			if errors.Is(err, tasks.ErrLeaseLost) {
				m.logger().Warn("arbor: conversation taken over; machine stops")
				m.cancel(errConversationLost)
			} else if err != nil && m.ctx.Err() == nil {
				m.logger().Warn("arbor: claiming tasks failed", slog.String("error", err.Error()))
			}
			claimed = n
		}
		if m.busy() > 0 || claimed > 0 {
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

// release frees the lease (fenced by the epoch: a lease already taken over
// is left alone).
func (m *machine) release() {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.r.runCtx), 10*time.Second)
	defer cancel()
	if _, err := m.r.store.ReleaseConversation(ctx, m.r.engine.Pool(), m.fence.ConversationID, m.fence.Owner, m.fence.Epoch); err != nil {
		m.logger().Warn("arbor: releasing the conversation failed; its lease will expire", slog.String("error", err.Error()))
	}
	m.cancel(context.Canceled)
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
	states, err := m.r.store.RunStates(m.ctx, m.r.engine.Pool(), ids)
	if err != nil {
		return
	}
	now := time.Now()
	lease := m.r.engine.Config().LeaseDuration
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range states {
		a := m.runs[st.ID]
		if a == nil {
			continue
		}
		if st.Status != fsm.Running || st.Token != a.token {
			a.cancel(ErrTaskStopped)
			continue
		}
		deadline := a.run.leaseDeadline()
		switch {
		case now.After(deadline.Add(lease)):
			m.logger().Warn("arbor: handler blocked past twice its lease; cancelling it",
				slog.Int64("task_id", st.ID), slog.String("kind", a.kind))
			a.cancel(ErrBlocked)
		case now.After(deadline) && !a.warned:
			a.warned = true
			m.logger().Warn("arbor: handler ran past its lease without a checkpoint or heartbeat",
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
// started. A machine that gets no slot is poked when one is given back.
func (m *machine) claimAndRun() (int, error) {
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
		return 0, nil
	}
	roots, err := m.r.store.LiveRoots(m.ctx, m.r.engine.Pool(), m.fence.ConversationID)
	if err != nil {
		m.r.releaseSlots(free)
		return 0, err
	}
	startable := reconcile.Generations(roots, m.r.isGen)
	claimed, err := m.r.engine.ClaimRunnable(m.ctx, tasks.ClaimRunnableParams{
		Fence: m.fence, Kinds: m.r.kinds, Roots: startable, Limit: free})
	m.r.releaseSlots(free - len(claimed))
	if err != nil {
		return 0, err
	}
	for _, t := range claimed {
		m.start(t)
	}
	return len(claimed), nil
}

// start runs a claimed task's handler on a worker slot already taken.
func (m *machine) start(t tasks.Task) {
	ctx, cancel := context.WithCancelCause(m.ctx)
	run := newRun(m.r.engine, t)
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

func (m *machine) execute(ctx context.Context, run *Run) {
	t := run.Task
	log := m.logger().With(slog.Int64("task_id", t.ID), slog.String("kind", t.Kind), slog.Int("attempt", t.Attempt))
	h := m.r.handlers[t.Kind]
	err := callHandler(ctx, h, run)
	if run.Ended() {
		return
	}
	// The handler left its run open: end it for the handler. Writes use a
	// context of their own: the handler's may be cancelled (and if the task
	// was taken from this run, the write is refused anyway).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err == nil {
		err = run.Complete(wctx, nil)
		if err != nil && !run.Ended() {
			log.Warn("arbor: completing the task failed", slog.String("error", err.Error()))
		}
		return
	}
	if cause := context.Cause(ctx); cause != nil &&
		(errors.Is(cause, ErrTaskStopped) || errors.Is(cause, ErrShutdown) || errors.Is(cause, tasks.ErrLeaseLost)) {
		// Aborted or cancelled elsewhere: nothing to write. Cut by a
		// shutdown or a lost lease: not the handler's failure; the task
		// stays running and the conversation's next holder recovers it.
		return
	}
	if _, ferr := m.r.engine.Fail(wctx, t.ID, t.Token, failure(err)); ferr != nil &&
		!errors.Is(ferr, tasks.ErrAborted) && !errors.Is(ferr, tasks.ErrNotRunning) && !errors.Is(ferr, tasks.ErrLeaseLost) {
		log.Warn("arbor: failing the task failed", slog.String("error", ferr.Error()), slog.String("handler_error", err.Error()))
	}
}
