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
	"github.com/arborhq/arbor/store"
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

	// unclaimed is set when a claim's commit had no answer (ErrAmbiguous):
	// if it committed, the tasks it claimed run under this lease with no
	// handler. The loop's next claims look for them instead, until a look
	// succeeds. Only the loop's goroutine uses it.
	unclaimed bool
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
		if m.busy() > 0 || claimed > 0 || starved || m.unclaimed {
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
	var claimed []arbortype.Task
	if m.unclaimed {
		claimed, err = m.orphans(free)
	} else {
		claimed, err = core.Tx(m.ctx, m.r.core, func(tx pgx.Tx) ([]arbortype.Task, error) {
			roots, err := m.r.core.Store.LiveRoots(m.ctx, tx, m.lease.ConversationID)
			if err != nil {
				return nil, err
			}
			return m.r.core.Claim(m.ctx, tx, m.lease, core.ClaimParams{
				Kinds: m.r.kinds, Roots: generations(roots, m.r.isGen), Limit: free})
		})
		if errors.Is(err, tasks.ErrAmbiguous) {
			m.unclaimed = true
			m.poke()
		}
	}
	m.r.releaseSlots(free - len(claimed))
	if err != nil {
		return 0, false, err
	}
	for _, t := range claimed {
		m.start(t)
	}
	return len(claimed), false, nil
}

// orphans finds up to limit tasks that run under this machine's lease
// (its epoch) without a handler here: what a claim whose commit had no
// answer started, if it committed. Only this machine starts tasks under its
// epoch, and every task it started runs until its run ends, so such a task
// is one of those; it is run now, with the token the claim gave it, as the
// claim would have. Once all are found, the machine claims again.
//
// The claim's COMMIT may still be under way in the server when its client
// gave up on it, so a plain read could miss what it is committing: the
// read comes after locking the conversation row, which waits for the claim
// (it holds the row in share mode) to end, and fails with ErrLeaseLost if
// the lease is gone.
func (m *machine) orphans(limit int) ([]arbortype.Task, error) {
	running, err := core.Tx(m.ctx, m.r.core, func(tx pgx.Tx) ([]arbortype.Task, error) {
		if err := m.r.core.LockLease(m.ctx, tx, m.lease); err != nil {
			return nil, err
		}
		return m.r.core.Store.TasksInStatus(m.ctx, tx, m.lease.ConversationID, arbortype.StatusRunning)
	})
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []arbortype.Task
	for _, t := range running {
		if t.Epoch != m.lease.Epoch || m.runs[t.ID] != nil || m.r.handlers[t.Kind] == nil {
			continue
		}
		if len(out) == limit {
			m.poke() // more than this claim has slots for
			return out, nil
		}
		out = append(out, t)
	}
	m.unclaimed = false
	return out, nil
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
//
// An error of the infrastructure's — the database unavailable past the
// engine's retry budget, or a commit whose outcome stayed unknown — is not
// the handler's failure: the runner waits for the database, and if the
// task is still this run's, calls the handler again (same run, same token,
// from its last checkpoint; its spawns without keys of their own return the
// children the last call made). A task fails only for the handler's own
// error.
func (m *machine) execute(ctx context.Context, run *Run) {
	t := run.Task
	log := m.logger().With(slog.Int64("task_id", t.ID), slog.String("kind", t.Kind), slog.Int("attempt", t.Attempt))
	for try := 0; ; try++ {
		run.mu.Lock()
		run.spawns = 0
		run.mu.Unlock()
		err := callHandler(ctx, m.r.handlers[t.Kind], run)
		if run.Ended() || runOver(err) || stopped(ctx) {
			return
		}
		if infrastructure(err) {
			log.Warn("arbor: the handler was cut off from the database; it runs again when the database is back",
				slog.String("error", err.Error()))
			if !m.stillOurs(ctx, run, try) {
				return
			}
			continue
		}
		m.endFor(ctx, run, err, log)
		return
	}
}

// endFor writes the end of a run its handler left open: complete for a nil
// return, fail for an error. A write cut off from the database is tried
// again until it lands, the run is over, or the machine stops (then the
// release, or the next holder, recovers the task).
func (m *machine) endFor(ctx context.Context, run *Run, handlerErr error, log *slog.Logger) {
	for try := 0; ; try++ {
		var err error
		if handlerErr == nil {
			err = run.Complete(ctx, nil)
		} else {
			err = run.fail(ctx, handlerErr)
		}
		switch {
		case err == nil || runOver(err) || run.Ended():
			return
		case infrastructure(err) && m.stillOurs(ctx, run, try):
			continue
		case infrastructure(err):
			return
		}
		log.Warn("arbor: ending the run failed", slog.String("error", err.Error()),
			slog.Any("handler_error", handlerErr))
		return
	}
}

// stillOurs waits out a database fault and reports whether the run still
// holds its task: false when the machine stops first, or when the task was
// taken from the run meanwhile.
func (m *machine) stillOurs(ctx context.Context, run *Run, try int) bool {
	for ; ; try++ {
		if !sleepCtx(m.ctx, faultWait(try)) {
			return false
		}
		cur, err := core.Read(m.ctx, m.r.core, func(db store.DB) (arbortype.Task, error) {
			return m.r.core.Get(m.ctx, db, run.Task.ID)
		})
		if err == nil {
			return cur.Status == arbortype.StatusRunning && cur.Token == run.token && !stopped(ctx)
		}
		if m.ctx.Err() != nil {
			return false
		}
	}
}

// stopped reports whether the handler's context was cut by the task being
// taken from the run, a shutdown or a lost lease: nothing is written then
// (the task is the next holder's, or this release's, to recover).
func stopped(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return cause != nil && (errors.Is(cause, ErrTaskStopped) || errors.Is(cause, ErrShutdown) || errors.Is(cause, tasks.ErrLeaseLost))
}

// infrastructure reports whether err is arbor's own word that the database
// could not be used, rather than the handler's failure.
func infrastructure(err error) bool {
	return errors.Is(err, tasks.ErrUnavailable) || errors.Is(err, tasks.ErrAmbiguous)
}

// faultWait is the pause before the try'th look at the database after a
// fault: 50 ms doubling to at most 2 s.
func faultWait(try int) time.Duration {
	if try >= 6 {
		return 2 * time.Second
	}
	return 50 * time.Millisecond << try
}

// sleepCtx waits for d, or until ctx ends; it reports whether it waited.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
