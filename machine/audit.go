package machine

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/reconcile"
)

// auditInterval is how often the maintainer has the runner audit what it
// holds against the database (see docs/architecture.md, "The audit").
func (r *Runner) auditInterval() time.Duration {
	return max(r.cfg.ConversationLease, 10*r.cfg.PollInterval)
}

// audit finds and repairs what the node lost track of: tasks running under
// its lease with no run of their token here, and conversations this life
// holds in the database that the node does not know it holds (see
// docs/architecture.md, "The audit", for the order of its steps and why it is
// safe).
func (r *Runner) audit(ctx context.Context) {
	if !r.lease.usable(time.Now()) {
		return
	}
	holderID, _ := r.lease.holder()
	inDB, err := core.Read(ctx, r.core, func(db store.DB) ([]core.Lease, error) {
		return r.core.HeldBy(ctx, db, r.cfg.NodeID, holderID)
	})
	if err != nil {
		return
	}
	r.mu.Lock()
	held := make([]string, 0, len(r.held))
	for id, h := range r.held {
		if !h.releasing {
			held = append(held, id)
		}
	}
	r.mu.Unlock()
	slices.Sort(held)
	var running []arbortype.Task
	if len(held) > 0 {
		running, err = core.Read(ctx, r.core, func(db store.DB) ([]arbortype.Task, error) { return r.core.RunningIn(ctx, db, held) })
		if err != nil {
			return
		}
	}

	// Nothing found without the claims' lock: nothing to repair, and no
	// claim or flush of the node paused for the audit.
	if lost, unaware := r.auditFind(holderID, inDB, running); len(lost) == 0 && len(unaware) == 0 {
		return
	}
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	lost, unaware := r.auditFind(holderID, inDB, running)
	if len(lost) == 0 && len(unaware) == 0 {
		return // a claim between its commit and its dispatch, seen by the first look
	}
	// The node claims nothing while it repairs: each repair skips a
	// conversation another transaction holds (left for the next audit)
	// rather than wait for it, and the whole is bounded.
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ConversationLease)
	defer cancel()
	for _, l := range slices.SortedFunc(maps.Keys(lost), func(a, b core.Lease) int { return strings.Compare(a.ConversationID, b.ConversationID) }) {
		tokens := lost[l]
		rep, err := core.Tx(ctx, r.core, func(tx pgx.Tx) (reconcile.Report, error) {
			if err := r.core.TryLockLease(ctx, tx, l); err != nil {
				return reconcile.Report{}, err
			}
			return recovery.RecoverTasks(ctx, r.core, tx, l.ConversationID, tokens, r.uncalled)
		})
		switch {
		case errors.Is(err, arbortype.ErrLeaseLost):
			continue // changed hands (nothing of it is this node's to repair), or busy (the next audit looks again)
		case err != nil:
			if ctx.Err() == nil {
				r.logger.Warn("arbor: the audit could not recover runs this node lost track of; it tries again at the next audit",
					slog.String("conversation_id", l.ConversationID), slog.String("error", err.Error()))
			}
			continue
		case !rep.Empty():
			r.logger.Warn("arbor: the audit found tasks running under this node's lease with no run here (a write or read lost to a split brain of the database's HA system, or an unresolved commit); they were recovered",
				slog.Any("report", rep))
		}
		r.markDirty(l.ConversationID)
	}
	for _, l := range unaware {
		rep, err := releaseLocked(ctx, r.core, l, r.uncalled, r.core.TryLockLease)
		switch {
		case errors.Is(err, arbortype.ErrLeaseLost):
			continue
		case err != nil:
			if ctx.Err() == nil {
				r.logger.Warn("arbor: the audit could not release a conversation this node held unawares; it tries again at the next audit",
					slog.String("conversation_id", l.ConversationID), slog.String("error", err.Error()))
			}
			continue
		}
		r.logger.Warn("arbor: the audit found a conversation this node held without knowing it (a write lost to a split brain of the database's HA system, or an unresolved commit); it was released, its running tasks recovered",
			slog.String("conversation_id", l.ConversationID), slog.Any("report", rep))
		r.markNews(l.ConversationID)
	}
}

// auditFind is the audit's second step, under Runner.mu (with claimMu held
// for writing by the caller): the runs lost, by the lease they run under
// (task id → token), and the leases held unawares.
func (r *Runner) auditFind(holderID int64, inDB []core.Lease, running []arbortype.Task) (lost map[core.Lease]map[int64]int64, unaware []core.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || !r.lease.usable(time.Now()) {
		return nil, nil
	}
	if id, _ := r.lease.holder(); id != holderID {
		return nil, nil // a new life began since the reads
	}
	for _, l := range inDB {
		_, held := r.held[l.ConversationID]
		_, lapsed := r.lapsed[l.ConversationID]
		if !held && !lapsed && r.liveIn[l.ConversationID] == 0 {
			unaware = append(unaware, l)
		}
	}
	lost = map[core.Lease]map[int64]int64{}
	for _, t := range running {
		h := r.held[t.ConversationID]
		if h == nil || h.releasing || h.lease.Epoch != t.Epoch || r.runsToken(t.ID, t.Token) {
			continue
		}
		if lost[h.lease] == nil {
			lost[h.lease] = map[int64]int64{}
		}
		lost[h.lease][t.ID] = t.Token
	}
	return lost, unaware
}

// queuedLateBegin and queuedLateEnd count an outcome of token still
// queued after its caller stopped waiting for it (Runner.queuedLate).
func (r *Runner) queuedLateBegin(token int64) {
	r.mu.Lock()
	r.queuedLate[token]++
	r.mu.Unlock()
}

func (r *Runner) queuedLateEnd(token int64) {
	r.mu.Lock()
	if r.queuedLate[token]--; r.queuedLate[token] <= 0 {
		delete(r.queuedLate, token)
	}
	r.mu.Unlock()
}

// runsToken reports whether a run of task id with token is here, running
// or waiting for the previous one, or has an outcome still queued in the
// completer (under r.mu).
func (r *Runner) runsToken(id, token int64) bool {
	if r.queuedLate[token] > 0 {
		return true
	}
	if a := r.runs[id]; a != nil && a.token == token {
		return true
	}
	if a := r.waiting[id]; a != nil && a.token == token {
		return true
	}
	return false
}
