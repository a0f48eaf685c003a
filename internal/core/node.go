package core

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// The node runner's operations: each covers many conversations or tasks in
// a few statements (see package machine's doc for the loops that call them).

// CountOpenable says how many conversations, at most limit, an
// OpenConversations with the same kinds and named would find now.
func (e *Engine) CountOpenable(ctx context.Context, db store.DB, kinds []string, limit int, named []string) (int, error) {
	n, err := e.Store.CountOpenable(ctx, db, kinds, limit, named, max(100, 4*limit))
	if err != nil {
		return 0, fmt.Errorf("count conversations to open: %w", mapDBError(err))
	}
	return n, nil
}

// Opened is what OpenConversations or Reopen took.
type Opened struct {
	// Leases of the conversations taken, in id order.
	Leases []Lease
	// Recover lists those among them with something for recovery to look
	// at (recovery.OnOpenMany); the others need none.
	Recover []string
	// Taken says, by conversation, what each take-over found of the holder
	// before it (whether its recoveries count as restarts).
	Taken map[string]Taken
	// Xact is the transaction's id (0 when nothing was taken).
	Xact int64
	// NextAfter is the tenant after which the next scan of
	// OpenConversations starts (nil: from the first).
	NextAfter *string
}

// OpenTenants bounds how many tenants with pending work one open scans.
const OpenTenants = 256

// OpenConversations gives the holder (name and row) up to limit
// conversations that have work for kinds and no live holder. The rows stay
// locked until tx ends: the caller recovers those in Recover
// (recovery.OnOpenMany) and claims their work before it commits.
//
// With named, only those conversations are looked at (the ones the
// change channel named), by primary key; without, the tenants with pending
// work are scanned, up to OpenTenants of them from the one after the tenant
// after (nil: the first; wrapping around), for their oldest pending tasks in conversations with no
// live holder, and the conversations of lapsed holders with runs left.
// Either way the conversations are taken fairly across tenants
// (docs/design.md §3.15). Opened.NextAfter is where the next scan starts.
func (e *Engine) OpenConversations(ctx context.Context, tx pgx.Tx, holder string, holderID int64, kinds []string, limit int, named []string, after *string, busy store.Busy) (Opened, error) {
	var (
		opened []store.OpenedLease
		err    error
	)
	if named != nil {
		opened, err = e.Store.OpenNamed(ctx, tx, holder, holderID, kinds, limit, named, busy)
	} else {
		opened, err = e.Store.OpenConversations(ctx, tx, holder, holderID, kinds, limit, max(100, 4*limit), after, OpenTenants, busy)
	}
	if err != nil {
		return Opened{}, fmt.Errorf("open conversations: %w", mapDBError(err))
	}
	o := opened2(holder, holderID, opened)
	o.NextAfter = after
	if named == nil {
		// Past the tenants served, so that beyond OpenTenants tenants each
		// gets its turn; from the first again when nothing was taken.
		o.NextAfter = nil
		for _, l := range opened {
			if o.NextAfter == nil || l.Tenant > *o.NextAfter {
				o.NextAfter = &l.Tenant
			}
		}
	}
	return o, nil
}

// Reopen locks the conversations of ls (leases of one holder row) that it
// still holds at their epochs, skipping those another transaction holds,
// and returns them as an open would: the caller recovers those in Recover
// and claims their work before it commits. For a holder whose fence fired
// while its row stayed live: its runs there were stopped by itself.
func (e *Engine) Reopen(ctx context.Context, tx pgx.Tx, ls []Lease) (Opened, error) {
	if len(ls) == 0 {
		return Opened{}, nil
	}
	ids, epochs := make([]string, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ids[i], epochs[i] = l.ConversationID, l.Epoch
	}
	opened, err := e.Store.Reopen(ctx, tx, ls[0].HolderID, ids, epochs)
	if err != nil {
		return Opened{}, fmt.Errorf("reopen %d conversations: %w", len(ls), mapDBError(err))
	}
	return opened2(ls[0].Holder, ls[0].HolderID, opened), nil
}

func opened2(holder string, holderID int64, opened []store.OpenedLease) Opened {
	out := Opened{Taken: make(map[string]Taken, len(opened))}
	for _, o := range opened {
		out.Leases = append(out.Leases, Lease{ConversationID: o.ConversationID, Holder: holder, HolderID: holderID, Epoch: o.Epoch})
		out.Xact = o.Xact
		out.Taken[o.ConversationID] = Taken{PrevHolder: o.PrevHolder, PrevRestarted: o.PrevRestarted}
		if o.Recover {
			out.Recover = append(out.Recover, o.ConversationID)
		}
	}
	slices.SortFunc(out.Leases, func(a, b Lease) int { return strings.Compare(a.ConversationID, b.ConversationID) })
	return out
}

// ClaimParamsFor select what a node claims across the conversations it
// holds.
type ClaimParamsFor struct {
	// Holder is the node's holder row: only conversations it holds are
	// claimed in, locked as held.
	Holder int64
	// Conversations limits the claim to these (nil: every held one).
	Conversations []string
	// Kinds are the kinds the node has handlers for (nil: any).
	Kinds []string
	// GenerationKinds are the root kinds that are generations (nil: every
	// root is one).
	GenerationKinds []string
	// Limit is the most tasks to start.
	Limit int
	// Busy is what the node runs now, by tenant: the claim shares its
	// places among tenants by weight from there (docs/design.md §3.15).
	Busy store.Busy
	// Claimed, when set, is given the runs claimed, inside the
	// transaction, before it commits: a runner records them as not handed
	// to a handler yet, so that a recovery it makes before it enters their
	// handlers requeues them (docs/architecture.md, "Restarts: what counts").
	Claimed func(runs []Task)
}

// ClaimFor starts up to p.Limit runnable tasks across the conversations
// p.Holder holds, oldest first, by the generation rule, each with its own
// token and its conversation's epoch, fenced by the conversation's share
// lock as held; rows other transactions hold are skipped, so the claim
// never waits. It returns the runs' rows (without a settled task's columns).
//
// xact is the transaction's id, for resolving a commit whose answer is lost
// (0 when nothing was claimed: then nothing was written).
func (e *Engine) ClaimFor(ctx context.Context, tx pgx.Tx, p ClaimParamsFor) (claimed []Task, xact int64, err error) {
	if p.Limit <= 0 {
		return nil, 0, nil
	}
	to, err := fsm.Transition(arbortype.StatusPending, fsm.Start)
	if err != nil {
		return nil, 0, err
	}
	if p.Conversations != nil {
		claimed, xact, err = e.Store.ClaimIn(ctx, tx, p.Holder, p.Conversations, p.Kinds, p.GenerationKinds, min(p.Limit, maxBatch), to, e.Cfg.TaskLease, p.Busy)
	} else {
		claimed, xact, err = e.Store.ClaimHeld(ctx, tx, p.Holder, p.Kinds, p.GenerationKinds, min(p.Limit, maxBatch), to, e.Cfg.TaskLease, p.Busy)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("claim for holder %d: %w", p.Holder, mapDBError(err))
	}
	if p.Claimed != nil && len(claimed) > 0 {
		p.Claimed(claimed)
	}
	return claimed, xact, nil
}

// ReleaseIdle frees the leases among ls that have nothing running, in one
// statement, and returns the conversations it freed; a lease taken over
// already, or with a run under it, is left out.
func (e *Engine) ReleaseIdle(ctx context.Context, db store.DB, holder int64, ls []Lease) ([]string, error) {
	ids, epochs := make([]string, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ids[i], epochs[i] = l.ConversationID, l.Epoch
	}
	freed, err := e.Store.ReleaseIdle(ctx, db, holder, ids, epochs)
	if err != nil {
		return nil, fmt.Errorf("release %d conversations: %w", len(ls), err)
	}
	return freed, nil
}

// LockHeld locks the conversations among convs that holder holds, that
// have a pending task (work), and that no other transaction holds (the
// others are skipped, not waited for). It returns those with work and, of
// them, those it locked: the caller's claim in these then sees every
// runnable task, and it knows which it could not look at. One with no
// pending task, as of the statement's snapshot, had nothing to claim.
func (e *Engine) LockHeld(ctx context.Context, tx pgx.Tx, holder int64, convs []string) (work, locked []string, err error) {
	work, locked, err = e.Store.LockHeld(ctx, tx, convs, holder)
	if err != nil {
		return nil, nil, fmt.Errorf("lock %d held conversations: %w", len(convs), mapDBError(err))
	}
	return work, locked, nil
}

// XactID returns the id of tx's transaction, for XactCommitted.
func (e *Engine) XactID(ctx context.Context, tx pgx.Tx) (int64, error) {
	id, err := e.Store.XactID(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("transaction id: %w", mapDBError(err))
	}
	return id, nil
}

// XactCommitted resolves a commit whose outcome is unknown (ErrAmbiguous):
// it asks the database what became of transaction xact, waiting while the
// transaction is still in progress (its COMMIT may still be on its way, or
// the server may not have noticed the lost connection yet), and reports
// whether it committed. It gives up with ctx, or with ErrUnavailable, or
// with ErrAmbiguous when the transaction is too old for the database to
// know. An id the server never gave out did not commit there (a failover's
// new primary that never received the transaction's records).
//
// Across a failover an id is not proof of identity: an id the old primary
// gave a transaction whose records never reached the standby is given out
// again by the promoted standby, to another transaction, so "committed" or
// "in progress" may be that other one's. A caller whose writes can be read
// back checks them (the completer does: see completer.resolve).
func XactCommitted(ctx context.Context, e *Engine, xact int64) (bool, error) {
	for try := 0; ; try++ {
		st, err := Read(ctx, e, func(db store.DB) (string, error) { return e.Store.XactStatus(ctx, db, xact) })
		if err != nil {
			return false, fmt.Errorf("resolving transaction %d: %w", xact, err)
		}
		switch st {
		case "committed":
			return true, nil
		case "aborted":
			return false, nil
		case "":
			return false, fmt.Errorf("transaction %d is too old to resolve: %w", xact, arbortype.ErrAmbiguous)
		case "future":
			// Never given out by this server: a standby promoted before the
			// transaction's records reached it. Nothing of it is here.
			return false, nil
		}
		if !sleepCtx(ctx, faultBackoff(try)) {
			return false, fmt.Errorf("resolving transaction %d: %w", xact, ctx.Err())
		}
	}
}

// HeldBy lists the conversations holder row holderID (named holder) holds.
func (e *Engine) HeldBy(ctx context.Context, db store.DB, holder string, holderID int64) ([]Lease, error) {
	ls, err := e.Store.HeldBy(ctx, db, holderID)
	if err != nil {
		return nil, fmt.Errorf("leases of %q: %w", holder, err)
	}
	out := make([]Lease, len(ls))
	for i, l := range ls {
		out[i] = Lease{ConversationID: l.ConversationID, Holder: holder, HolderID: holderID, Epoch: l.Epoch}
	}
	return out, nil
}

// RunningIn reads the running tasks of the conversations, in id order.
func (e *Engine) RunningIn(ctx context.Context, db store.DB, convs []string) ([]Task, error) {
	ts, err := e.Store.RunningIn(ctx, db, convs)
	if err != nil {
		return nil, fmt.Errorf("running tasks of %d conversations: %w", len(convs), err)
	}
	return ts, nil
}
