package machine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// watchdog watches the runner's handlers:
//
//   - check: the runs of the conversations a notification named (or a
//     flush that failed a task), and on each PollInterval every run, are
//     read back on the control pool, each read bounded; a run whose task
//     is no longer its own (aborted, cancelled, expired, taken over) has its
//     context cancelled (ErrTaskStopped). A run that ended itself (its
//     ending write queued, or a …Tx form whose transaction the handler is
//     committing) is left alone: its context is its own until it returns;
//   - a handler past its task lease outside arbor's calls without a
//     checkpoint or heartbeat is warned about, and cancelled past
//     RunnerConfig.BlockedAfter when that is set;
//   - a handler that has not returned a conversation lease after its
//     context was cancelled is warned about every lease, by task: its task
//     stays held here until it returns.
//
// None of it is on the fence's path: the fence fires on the local clock
// whatever the watchdog's reads do.
type watchdog struct {
	r    *Runner
	core *core.Engine // on the control pool

	mu     sync.Mutex
	convs  map[string]bool
	all    bool
	wakeUp chan struct{}
	// polls counts the read-backs of every run done (a test's clock for
	// the bound on an abort's reaching a handler).
	polls atomic.Int64
}

func newWatchdog(r *Runner) *watchdog {
	return &watchdog{r: r, core: r.app.WithPool(r.pools.control), convs: map[string]bool{}, wakeUp: make(chan struct{}, 1)}
}

// check asks for the runs of convs to be read back (none given: all).
func (w *watchdog) check(convs ...string) {
	w.mu.Lock()
	if len(convs) == 0 {
		w.all = true
	}
	for _, c := range convs {
		w.convs[c] = true
	}
	w.mu.Unlock()
	select {
	case w.wakeUp <- struct{}{}:
	default:
	}
}

// checkLoop reads back what check asked for, as soon as it is asked.
func (w *watchdog) checkLoop() {
	for {
		select {
		case <-w.r.runCtx.Done():
			return
		case <-w.wakeUp:
		}
		w.mu.Lock()
		convs, all := w.convs, w.all
		w.convs, w.all = map[string]bool{}, false
		w.mu.Unlock()
		if w.checkRuns(convs, all) && all {
			w.polls.Add(1)
		}
	}
}

// checkRuns cancels the handlers whose task is no longer theirs, of the
// conversations convs (all: every run here); false when it could not read.
func (w *watchdog) checkRuns(convs map[string]bool, all bool) bool {
	r := w.r
	r.mu.Lock()
	var ids, tokens []int64
	for id, a := range r.runs {
		if (all || convs[a.conv]) && !a.run.endingOrEnded() {
			ids, tokens = append(ids, id), append(tokens, a.token)
		}
	}
	for id, a := range r.waiting {
		if all || convs[a.conv] {
			ids, tokens = append(ids, id), append(tokens, a.token)
		}
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(r.runCtx, max(r.cfg.ConversationLease/4, time.Second))
	defer cancel()
	states, err := w.core.Store.RunStates(ctx, w.core.Pool, ids)
	if err != nil {
		return false
	}
	cur := make(map[int64]int64, len(states)) // the token of each task still running
	for _, st := range states {
		if st.Status == arbortype.StatusRunning {
			cur[st.ID] = st.Token
		}
	}
	var stop, stopTokens []int64
	for i, id := range ids {
		if tok, ok := cur[id]; !ok || tok != tokens[i] {
			stop, stopTokens = append(stop, id), append(stopTokens, tokens[i])
		}
	}
	r.stopRuns(stop, stopTokens, ErrTaskStopped)
	return true
}

// loop checks every run each PollInterval, and warns about blocked and
// stuck handlers.
func (w *watchdog) loop() {
	r := w.r
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	lease := r.core.Cfg.TaskLease
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-tick.C:
		}
		w.check()
		now := time.Now()
		r.mu.Lock()
		for id, a := range r.runs {
			if !a.cancelledAt.IsZero() {
				if now.Sub(a.cancelledAt) >= r.cfg.ConversationLease && now.Sub(a.stuckWarned) >= r.cfg.ConversationLease {
					a.stuckWarned = now
					msg := "arbor: a handler has not returned since its context was cancelled; its task stays held on this node, and its next run waits for it"
					if !a.run.handlerRunning() {
						// It returned; the runner's write of its end waits for the database.
						msg = "arbor: a run's end is still being written since its context was cancelled (the database slow or unreachable); its task stays held on this node, and its next run waits for it"
					}
					r.logger.Warn(msg, slog.Int64("task_id", id), slog.String("kind", a.kind), slog.String("conversation_id", a.conv),
						slog.Duration("since", now.Sub(a.cancelledAt)), slog.Any("cause", context.Cause(a.ctx)))
				}
				continue
			}
			inCall, last := a.run.activity()
			if inCall || a.run.Ended() {
				continue
			}
			outside := now.Sub(last)
			switch {
			case r.cfg.BlockedAfter > 0 && outside > r.cfg.BlockedAfter:
				r.logger.Warn("arbor: handler ran past RunnerConfig.BlockedAfter without a checkpoint or heartbeat; cancelling it",
					slog.Int64("task_id", id), slog.String("kind", a.kind))
				a.stop(ErrBlocked)
			case outside > lease && !a.warned:
				a.warned = true
				r.logger.Warn("arbor: handler ran past its task lease without a checkpoint, heartbeat or other call of arbor's",
					slog.Int64("task_id", id), slog.String("kind", a.kind), slog.Duration("outside", outside))
			}
		}
		r.mu.Unlock()
	}
}
