package core

import (
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/guardrules"
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
	// Runs says whether the runner runs tasks of kind.
	Runs(kind string) bool
	// Grant reserves up to n workers for tasks the create may start, or
	// returns nil.
	Grant(n int) StartGrant
	// GrantIn reserves workers for a claim, in an emit's transaction, in
	// conv, which the runner holds, or returns nil.
	GrantIn(conv string) ClaimGrant
}

// ClaimGrant is the workers a Starter reserved for the claim an emit makes
// in its own transaction (docs/design.md §3.18, "A wake by an event").
type ClaimGrant interface {
	// Params is the claim to make: the runner's, in the one conversation,
	// for the workers reserved.
	Params() ClaimParamsFor
	// Done is told, once, what the emit's transaction came to: the runs
	// its claim took and the transaction's id (for a commit whose answer
	// was lost), or its error.
	Done(claimed []Task, xact int64, err error)
}

// StartGrant is the workers a Starter reserved for one create.
type StartGrant interface {
	// Holder is the runner's holder row, which the create's statement
	// takes the conversations for.
	Holder() int64
	// N is how many workers it reserved (at least 1).
	N() int
	// Done is told what the create did, once: the tasks it started
	// (running), or the create's error (an ErrAmbiguous one may have
	// started some).
	Done(started []Task, err error)
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

// startable says whether a create may start p: a root with no concurrency
// key (its slots are taken at a start, by the claim), no budgets of its
// own, not abandoned on a restart (a run never entered but recovered after
// a crash would be abandoned).
func startable(p CreateParams) bool {
	return p.OwnerID == 0 && p.ConcurrencyKey == "" && !p.AbandonOnRestart && !p.HasBudgets()
}

// Grant asks the registered starters for workers for the tasks among ps a
// create may start, and returns the first grant given, with the starter's
// kinds; nil when none gives one.
func (e *Engine) Grant(ps []CreateParams) (StartGrant, func(kind string) bool) {
	e.starters.mu.Lock()
	list := e.starters.list
	e.starters.mu.Unlock()
	for _, s := range list {
		n := 0
		for _, p := range ps {
			if startable(p) && s.Runs(p.Kind) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		if g := s.Grant(n); g != nil {
			return g, s.Runs
		}
	}
	return nil, nil
}

// GrantIn asks the registered starters for workers for a claim in conv,
// held by one of them, in an emit's transaction; nil when none gives one.
func (e *Engine) GrantIn(conv string) ClaimGrant {
	e.starters.mu.Lock()
	list := e.starters.list
	e.starters.mu.Unlock()
	for _, s := range list {
		if g := s.GrantIn(conv); g != nil {
			return g
		}
	}
	return nil
}

// Start is what a create may start: up to N tasks under Holder, of the
// kinds Runs says (the zero Start starts none).
type Start struct {
	Holder int64
	N      int
	Runs   func(kind string) bool
}

// StartOf is the Start of grant g (the zero Start for none).
func StartOf(g StartGrant, runs func(kind string) bool) Start {
	if g == nil {
		return Start{}
	}
	return Start{Holder: g.Holder(), N: g.N(), Runs: runs}
}

// Started are the tasks among ts a create started.
func Started(ts []Task) []Task {
	var out []Task
	for _, t := range ts {
		if t.Status == arbortype.StatusRunning {
			out = append(out, t)
		}
	}
	return out
}

// startLease is the task lease of a run a create starts: the engine's.
func (e *Engine) startLease() time.Duration { return e.Cfg.TaskLease }

// IsGuardRefusal says whether err is the guard's refusal of an inserted
// task (nothing was written): for a create that started tasks, a limit
// that committed between its statement's snapshot and the guard's check.
func IsGuardRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == guardrules.SQLStateInvalidInsert
}
