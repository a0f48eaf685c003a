package core

import (
	"sync"
	"time"
)

// A first run folded into its create (docs/design.md §3.18,
// docs/architecture.md "A first run folded into its create").
//
// A runner of this process registers with its application's engine as a
// Starter. A one-statement root Create asks the starters, before its
// statement, for a grant: a worker of the runner reserved for the task and
// the claim lock read-held, given only while the runner's lease is usable,
// it is not stopping and it has room. The statement then takes a new
// conversation for the grant's holder and inserts the task running (or, in
// any other case, pending, as ever), and the grant is told what became of
// it: the runner holds the conversation and dispatches the run as it would
// a claimed one, or gives the worker back.

// Starter is a runner that may start, in their create, root tasks of the
// kinds it runs.
type Starter interface {
	// Grant reserves a worker for a root task of kind, or returns nil.
	Grant(kind string) StartGrant
}

// StartGrant is a worker a Starter reserved for one create.
type StartGrant interface {
	// Holder is the runner's holder row, which the create's statement
	// takes the conversation for.
	Holder() int64
	// Done is told what the create did, once: t, started by the
	// statement (t.Status running) or not, or the create's error (an
	// ErrAmbiguous one may have started it).
	Done(t Task, err error)
}

// starters are the runners registered with an engine (shared by its
// copies: WithPool, WithAnnouncePool).
type starters struct {
	mu   sync.Mutex
	list []Starter
}

// AddStarter registers s with the engine; RemoveStarter takes it off.
func (e *Engine) AddStarter(s Starter) {
	e.starters.mu.Lock()
	defer e.starters.mu.Unlock()
	e.starters.list = append(e.starters.list, s)
}

// RemoveStarter takes s off the engine's starters.
func (e *Engine) RemoveStarter(s Starter) {
	e.starters.mu.Lock()
	defer e.starters.mu.Unlock()
	for i, x := range e.starters.list {
		if x == s {
			e.starters.list = append(e.starters.list[:i:i], e.starters.list[i+1:]...)
			return
		}
	}
}

// grant asks the registered starters for a worker for p, a root task's
// create; nil when none gives one, or p is not one a create may start:
// one with a concurrency key (its slots are taken at a start, by the
// claim), or one abandoned on a restart (a run never entered but recovered
// after a crash would be abandoned).
func (e *Engine) grant(p CreateParams) StartGrant {
	if p.OwnerID != 0 || p.ConcurrencyKey != "" || p.AbandonOnRestart || p.HasBudgets() {
		return nil
	}
	e.starters.mu.Lock()
	list := e.starters.list
	e.starters.mu.Unlock()
	for _, s := range list {
		if g := s.Grant(p.Kind); g != nil {
			return g
		}
	}
	return nil
}

// startLease is the task lease of a run a create starts: the engine's.
func (e *Engine) startLease() time.Duration { return e.Cfg.TaskLease }
