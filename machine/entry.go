package machine

import (
	"context"
	"sync"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// entryCheck reads back the tasks of the runs about to be entered, so that
// no handler is entered for a task aborted, cancelled or settled after its
// claim committed (docs/design.md §3.8, "A run's entry"). The runs that ask
// while a read is in flight are read together by the next one: one
// statement per batch of entries, not one per run.
//
// A read that fails (the database unreachable) is tried again after
// faultWait until it answers or the runner stops: a run is never entered
// on a guess. A run whose context is cancelled meanwhile (the fence, a
// stop) stops waiting at once, and is not entered.
type entryCheck struct {
	r *Runner

	mu     sync.Mutex
	asks   []entryAsk
	wakeUp chan struct{}
}

// entryAsk is one run's question: is task id still running under token?
type entryAsk struct {
	id, token int64
	ok        chan bool // buffered: the answer never waits for its reader
}

func newEntryCheck(r *Runner) *entryCheck {
	return &entryCheck{r: r, wakeUp: make(chan struct{}, 1)}
}

// confirm reports whether a's task is still running under a's token, by a
// read that begins after confirm was called; false when a's context ends
// first, or the runner stops.
func (e *entryCheck) confirm(a *active) bool {
	ask := entryAsk{id: a.run.id, token: a.token, ok: make(chan bool, 1)}
	e.mu.Lock()
	e.asks = append(e.asks, ask)
	e.mu.Unlock()
	select {
	case e.wakeUp <- struct{}{}:
	default:
	}
	select {
	case ok := <-ask.ok:
		return ok
	case <-a.base.Done():
		return false
	}
}

// loop answers the asks, a batch per read, until the runner stops.
func (e *entryCheck) loop() {
	r := e.r
	for {
		select {
		case <-r.runCtx.Done():
			e.answerAll(false)
			return
		case <-e.wakeUp:
		}
		e.mu.Lock()
		asks := e.asks
		e.asks = nil
		e.mu.Unlock()
		if len(asks) == 0 {
			continue
		}
		running, ok := e.read(asks)
		if !ok {
			for _, a := range asks {
				a.ok <- false
			}
			e.answerAll(false)
			return
		}
		for _, a := range asks {
			tok, live := running[a.id]
			a.ok <- live && tok == a.token
		}
	}
}

// read returns the token of each task of asks still running, reading until
// the database answers; ok is false when the runner stopped first.
func (e *entryCheck) read(asks []entryAsk) (running map[int64]int64, ok bool) {
	r := e.r
	ids := make([]int64, len(asks))
	for i, a := range asks {
		ids[i] = a.id
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(r.runCtx, max(r.cfg.ConversationLease/4, time.Second))
		states, err := r.core.Store.RunStates(ctx, r.core.Pool, ids)
		cancel()
		if err == nil {
			running = make(map[int64]int64, len(states))
			for _, st := range states {
				if st.Status == arbortype.StatusRunning {
					running[st.ID] = st.Token
				}
			}
			return running, true
		}
		if !sleepCtx(r.runCtx, faultWait(try)) {
			return nil, false
		}
	}
}

// answerAll answers every ask left with ok (the runner stops: false).
func (e *entryCheck) answerAll(ok bool) {
	e.mu.Lock()
	asks := e.asks
	e.asks = nil
	e.mu.Unlock()
	for _, a := range asks {
		a.ok <- ok
	}
}
