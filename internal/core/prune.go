package core

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/arborhq/arbor/internal/store"
)

// PruneParams say what a prune deletes (see tasks.PruneParams).
type PruneParams struct {
	OlderThan time.Duration
	Batch     int
	DryRun    bool
}

// PruneResult counts what a prune deleted (or, dry, would delete).
type PruneResult struct {
	Conversations int64
	Turns         int64
	Tasks         int64
	// Rows counts the dependents' rows by name (store.DependentNames).
	Rows map[string]int64
	// Skipped counts the conversations a batch found locked by another
	// transaction: the next prune takes them.
	Skipped int64
}

// candidatePage is how many settled turns one look-up of candidates reads.
const candidatePage = 1000

// Prune deletes the settled history older than p.OlderThan: the ripe
// turns of every conversation (qPruneVictims says which), with their
// events, log entries and wake jobs, and every conversation left with
// nothing in use. It works one conversation at a time, p.Batch tasks per
// transaction; each transaction locks the conversation row first (skipping
// one another transaction holds) and is marked for the guard. A
// conversation pruned whole goes in its last batch, when no task is left.
//
// A fault after some batches committed leaves them committed: the error
// is returned with what was done so far, and the next prune goes on.
func (e *Engine) Prune(ctx context.Context, p PruneParams) (PruneResult, error) {
	res := PruneResult{Rows: map[string]int64{}}
	cutoff, err := Read(ctx, e, func(db store.DB) (time.Time, error) { return e.Store.PruneCutoff(ctx, db, p.OlderThan) })
	if err != nil {
		return res, fmt.Errorf("prune: %w", err)
	}
	var afterAt time.Time
	var afterID int64
	seen := map[string]bool{}
	for {
		page, err := Read(ctx, e, func(db store.DB) ([]store.PruneCandidate, error) {
			return e.Store.PruneCandidates(ctx, db, cutoff, afterAt, afterID, candidatePage)
		})
		if err != nil {
			return res, fmt.Errorf("prune: %w", err)
		}
		for _, c := range page {
			if seen[c.ConversationID] {
				continue
			}
			seen[c.ConversationID] = true
			if err := e.pruneConversation(ctx, c.ConversationID, cutoff, p, &res); err != nil {
				return res, fmt.Errorf("prune conversation %q: %w", c.ConversationID, err)
			}
		}
		if len(page) < candidatePage {
			break
		}
		last := page[len(page)-1]
		afterAt, afterID = last.SettledAt, last.ID
	}
	for after := ""; ; {
		page, err := Read(ctx, e, func(db store.DB) ([]string, error) {
			return e.Store.EmptyConversations(ctx, db, cutoff, after, candidatePage)
		})
		if err != nil {
			return res, fmt.Errorf("prune: %w", err)
		}
		for _, conv := range page {
			if err := e.pruneConversation(ctx, conv, cutoff, p, &res); err != nil {
				return res, fmt.Errorf("prune conversation %q: %w", conv, err)
			}
		}
		if len(page) < candidatePage {
			return res, nil
		}
		after = page[len(page)-1]
	}
}

// pruneTx runs fn in a transaction marked as the prune's
// (Store.MarkPrune: the guards let it delete what their delete rules
// allow), retried as Tx; the mark is removed before the commit.
func pruneTx[T any](ctx context.Context, e *Engine, fn func(tx pgx.Tx) (T, error)) (T, error) {
	return Tx(ctx, e, func(tx pgx.Tx) (T, error) {
		if err := e.Store.MarkPrune(ctx, tx); err != nil {
			var zero T
			return zero, err
		}
		v, err := fn(tx)
		if err != nil {
			return v, err
		}
		return v, e.Store.UnmarkPrune(ctx, tx)
	})
}

// PruneLog deletes up to limit log entries older than keep, oldest first,
// in one transaction marked as the prune's, and returns how many.
func (e *Engine) PruneLog(ctx context.Context, keep time.Duration, limit int) (int64, error) {
	return pruneTx(ctx, e, func(tx pgx.Tx) (int64, error) { return e.Store.PruneLog(ctx, tx, keep, limit) })
}

// pruneConversation prunes conv batch by batch until nothing of it is
// ripe.
func (e *Engine) pruneConversation(ctx context.Context, conv string, cutoff time.Time, p PruneParams, res *PruneResult) error {
	if p.DryRun {
		return e.countConversation(ctx, conv, cutoff, res)
	}
	for {
		type batch struct {
			tasks, turns int64
			deleted      bool
			skipped      bool
			more         bool
			rows         map[string]int64
		}
		b, err := pruneTx(ctx, e, func(tx pgx.Tx) (batch, error) {
			b := batch{rows: map[string]int64{}}
			ok, held, err := e.Store.LockConversationForPrune(ctx, tx, conv)
			if err != nil || !ok {
				b.skipped = err == nil
				return b, err
			}
			ids, turns, whole, err := e.Store.PruneVictims(ctx, tx, conv, cutoff, p.Batch)
			if err != nil {
				return b, err
			}
			if len(ids) > 0 {
				if err := e.Store.DeleteTaskDependents(ctx, tx, conv, ids, false, b.rows); err != nil {
					return b, err
				}
				if b.tasks, err = e.Store.DeleteTasks(ctx, tx, conv, ids); err != nil {
					return b, err
				}
			}
			// The batch took every task of the ripe turns when it took
			// fewer than it could: then they are gone.
			done := len(ids) < p.Batch
			if done {
				b.turns = turns
			}
			switch {
			case !done:
				b.more = true
			case whole && !held:
				more, err := e.Store.DeleteConversationDependents(ctx, tx, conv, p.Batch, false, b.rows)
				if err != nil || more {
					b.more = more
					return b, err
				}
				b.deleted, err = e.Store.DeleteConversation(ctx, tx, conv)
				return b, err
			}
			return b, nil
		})
		if err != nil {
			return err
		}
		res.Tasks += b.tasks
		res.Turns += b.turns
		for k, v := range b.rows {
			res.Rows[k] += v
		}
		if b.deleted {
			res.Conversations++
		}
		if b.skipped {
			res.Skipped++
		}
		if !b.more {
			return nil
		}
	}
}

// countConversation counts what pruning conv would delete, in one
// read-only snapshot, by the batches' rules: a conversation out of use goes
// whole only when no live holder has its lease (a held one loses its
// tasks and keeps its row, its own events and log, as the real prune
// leaves them).
func (e *Engine) countConversation(ctx context.Context, conv string, cutoff time.Time, res *PruneResult) error {
	type count struct {
		tasks, turns int64
		whole        bool
		rows         map[string]int64
	}
	c, err := Read(ctx, e, func(db store.DB) (count, error) {
		c := count{rows: map[string]int64{}}
		ids, turns, whole, err := e.Store.PruneVictims(ctx, db, conv, cutoff, maxInt32)
		if err != nil {
			return c, err
		}
		held := false
		if whole {
			if held, err = e.Store.ConversationHeld(ctx, db, conv); err != nil {
				return c, err
			}
		}
		c.tasks, c.turns, c.whole = int64(len(ids)), turns, whole && !held
		if c.whole {
			_, err = e.Store.DeleteConversationDependents(ctx, db, conv, maxInt32, true, c.rows)
		} else if len(ids) > 0 {
			err = e.Store.DeleteTaskDependents(ctx, db, conv, ids, true, c.rows)
		}
		return c, err
	})
	if err != nil {
		return err
	}
	res.Tasks += c.tasks
	res.Turns += c.turns
	for k, v := range c.rows {
		res.Rows[k] += v
	}
	if c.whole {
		res.Conversations++
	}
	return nil
}

// PruneJobKind and PruneQueue name the River job that prunes
// periodically (package machine's prune worker) and its queue.
const (
	PruneJobKind = store.PruneJobKind
	PruneQueue   = "arbor_maintenance"
)

// PruneArgs are the arguments of a prune job: none; the engine's
// configuration says what to prune.
type PruneArgs struct{}

// Kind is the River job kind of prune jobs.
func (PruneArgs) Kind() string { return PruneJobKind }

// InsertOpts puts prune jobs on their queue, one at a time: a prune still
// pending or running makes the next period's insert a no-op.
func (PruneArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       PruneQueue,
		MaxAttempts: 3,
		UniqueOpts: river.UniqueOpts{ByState: []rivertype.JobState{
			rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled,
		}},
	}
}
