package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// Violation is one breach of docs/design.md §4 found by the invariant checker.
type Violation struct {
	// Invariant is the number of the invariant in docs/design.md §4 (1–13); 0 for a
	// consistency rule of the engine's own (documented in its Message).
	Invariant      int
	ConversationID string
	TaskID         int64
	Message        string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d: conversation %q task %d: %s", v.Invariant, v.ConversationID, v.TaskID, v.Message)
}

// Check verifies the invariants of docs/design.md §4 over the given
// conversations (none given: every conversation of the schema) and returns
// every violation it finds, ordered by conversation and task. Each
// conversation is read in one REPEATABLE READ snapshot, so it sees a
// consistent state even while the conversation is being worked on. An
// unknown conversation is ErrNotFound.
//
// What it checks, per invariant:
//  1. every status is one of §2's, and the timestamps agree with the history
//     it implies (started_at for a task that ran, settled_at and a settle
//     sequence number exactly for settled tasks, none of aborted/orphaned
//     mixed up). The edges themselves are enforced by the database trigger
//     generated from fsm/, so an impossible history cannot be written;
//  2. a settled task has no run (no token, no lease) and, for each settled
//     foreground child of a settled owner, the child settled first;
//  3. a completed task has no live foreground child;
//  4. a wait names only the task's own children (also once it ended), and
//     a waiting task's wait is unsatisfied;
//  5. a sleeping task has a wake time and exactly one live wake job for that
//     sleep, and no wake job waits for a sleep that is over;
//  6. no live foreground child has a settled owner;
//  7. an owner is in the child's conversation and has a smaller id (the
//     ownership graph is a forest); with no conversation given, every row
//     of the tasks, events, log, budgets and reservations belongs to a
//     conversation that exists;
//  8. a running task has a token and a task lease deadline, and its run was
//     started under the conversation's current lease: the conversation has
//     a holder and its epoch is the run's. (An expired lease that nobody
//     took over yet is "being recovered": the next holder's recovery
//     requeues the task.)
//  9. a live task has attempt ≤ restart_limit; no two tasks hold one token;
//  10. a budget's spent and reserved are exactly the sums of the closed and
//     the open reservations of its scope's tasks;
//  11. and 12., and the records' parts of 1 and 8: see recordViolations
//     (events, the log, the holder, times, fork copies);
//  13. with no conversation given, a concurrency limit's running count is
//     exactly the runs whose slots name it (read in one snapshot).
//
// Also (invariant 0, rules of the engine's own): a completing task has a
// live foreground child (otherwise it should have completed), no live task
// is left abort_requested (an abort settles everything it marks in the same
// transaction), and no task was retried more often than its max_retries.
func (e *Engine) Check(ctx context.Context, conversationIDs ...string) ([]Violation, error) {
	for _, id := range conversationIDs {
		if err := checkText("conversation id", id, true); err != nil {
			return nil, fmt.Errorf("check: %w", err)
		}
	}
	ids := conversationIDs
	var out []Violation
	if len(ids) == 0 {
		var err error
		ids, err = Read(ctx, e, func(db store.DB) ([]string, error) { return e.Store.ConversationIDs(ctx, db) })
		if err != nil {
			return nil, fmt.Errorf("check: list conversations: %w", err)
		}
		// 7. every row belongs to a conversation that exists.
		orphans, err := Read(ctx, e, func(db store.DB) ([]store.OrphanRows, error) { return e.Store.OrphanRows(ctx, db, maxOrphanGroups) })
		if err != nil {
			return nil, fmt.Errorf("check: rows of no conversation: %w", err)
		}
		for _, o := range orphans {
			out = append(out, Violation{Invariant: 7, ConversationID: o.ConversationID,
				Message: fmt.Sprintf("%d rows of %s name this conversation, which does not exist", o.Rows, o.Table)})
		}
		// 13. every limit counts its runs.
		counts, err := Read(ctx, e, func(db store.DB) ([]store.SlotCount, error) { return e.Store.SlotCounts(ctx, db) })
		if err != nil {
			return nil, fmt.Errorf("check: concurrency limits: %w", err)
		}
		for _, c := range counts {
			if c.Running != c.Runs {
				out = append(out, Violation{Invariant: 13,
					Message: fmt.Sprintf("concurrency limit %q counts %d running, and %d runs hold a slot of it", c.Key, c.Running, c.Runs)})
			}
		}
		// 10. for tenant budgets, across the conversations of each tenant.
		tvs, err := Read(ctx, e, func(store.DB) ([]Violation, error) {
			var vs []Violation
			err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				var err error
				vs, err = e.tenantBudgetViolations(ctx, tx)
				return err
			})
			return vs, err
		})
		if err != nil {
			return nil, fmt.Errorf("check: tenant budgets: %w", err)
		}
		out = append(out, tvs...)
	}
	for _, id := range ids {
		vs, err := Read(ctx, e, func(store.DB) ([]Violation, error) {
			var vs []Violation
			err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				var err error
				vs, err = e.checkConversation(ctx, tx, id)
				return err
			})
			return vs, err
		})
		if err != nil {
			return nil, fmt.Errorf("check conversation %q: %w", id, err)
		}
		out = append(out, vs...)
	}
	return out, nil
}

// maxOrphanGroups bounds what Check reports of rows whose conversation
// does not exist: one violation per table and conversation, at most this
// many.
const maxOrphanGroups = 1000

func (e *Engine) checkConversation(ctx context.Context, tx pgx.Tx, conv string) ([]Violation, error) {
	convRow, err := e.Store.GetConversation(ctx, tx, conv)
	if store.IsNoRows(err) {
		return nil, arbortype.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	all, err := e.Store.ConversationTasks(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	var out []Violation
	add := func(inv int, id int64, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, ConversationID: conv, TaskID: id, Message: fmt.Sprintf(format, args...)})
	}
	byID := make(map[int64]*Task, len(all))
	children := make(map[int64][]*Task)
	for i := range all {
		t := &all[i]
		byID[t.ID] = t
		if t.OwnerID != 0 {
			children[t.OwnerID] = append(children[t.OwnerID], t)
		}
	}

	for i := range all {
		t := &all[i]
		// 1. statuses and the history they imply.
		if !t.Status.Valid() {
			add(1, t.ID, "unknown status %q", t.Status)
			continue
		}
		ran := t.Status == arbortype.StatusRunning || t.Status == arbortype.StatusWaiting || t.Status == arbortype.StatusSleeping ||
			t.Status == arbortype.StatusCompleting || t.Status == arbortype.StatusCompleted || t.Status == arbortype.StatusAborted
		if ran && t.StartedAt == nil {
			add(1, t.ID, "%s but never started (started_at is null)", t.Status)
		}
		if t.Status == arbortype.StatusOrphaned && t.StartedAt != nil {
			add(1, t.ID, "orphaned but it ran (started_at is set): it should be aborted")
		}
		if t.Status.Settled() != (t.SettledAt != nil) || t.Status.Settled() != (t.SettleSeq != 0) {
			add(1, t.ID, "%s with settled_at=%v settle_seq=%d", t.Status, t.SettledAt, t.SettleSeq)
		}
		// 2. a settled task holds no run.
		if t.Status.Settled() && (t.Token != 0 || t.LeaseExpiresAt != nil) {
			add(2, t.ID, "%s but still holds token %d / a lease", t.Status, t.Token)
		}
		// 7. same conversation, forest.
		if t.OwnerID != 0 {
			owner, ok := byID[t.OwnerID]
			switch {
			case !ok:
				add(7, t.ID, "owner %d is not in the conversation", t.OwnerID)
			case owner.ID >= t.ID:
				add(7, t.ID, "owner %d does not precede it: the ownership graph is not a forest", owner.ID)
			}
		}
		// 8. a running task has a run, under the conversation's current lease.
		if t.Status == arbortype.StatusRunning {
			switch {
			case t.Token == 0 || t.LeaseExpiresAt == nil:
				add(8, t.ID, "running without a token or a task lease deadline")
			case convRow.Holder == "":
				add(8, t.ID, "running in a conversation nobody holds: no lease fences its run")
			case t.Epoch != convRow.Epoch:
				add(8, t.ID, "running under lease epoch %d, but the conversation is at epoch %d: a take-over did not recover it", t.Epoch, convRow.Epoch)
			}
		}
		// 9. restart limit.
		if t.Status.Live() && t.Attempt > t.RestartLimit {
			add(9, t.ID, "live with attempt %d over restart_limit %d", t.Attempt, t.RestartLimit)
		}
		if t.Status.Live() && t.AbortRequested {
			add(0, t.ID, "live (%s) but abort_requested: an abort left it unsettled", t.Status)
		}

		var liveForeground []int64
		for _, c := range children[t.ID] {
			if c.Status.Live() && !c.Background {
				liveForeground = append(liveForeground, c.ID)
			}
			// 2, 6: children settle before their owner.
			if t.Status.Settled() && !c.Background {
				switch {
				case c.Status.Live():
					add(6, c.ID, "live foreground child of %s owner %d", t.Status, t.ID)
				case c.SettleSeq > t.SettleSeq:
					add(2, c.ID, "settled (seq %d) after its owner %d (seq %d)", c.SettleSeq, t.ID, t.SettleSeq)
				}
			}
		}
		// 3. completed only with every foreground child settled.
		if t.Status == arbortype.StatusCompleted && len(liveForeground) > 0 {
			add(3, t.ID, "completed with live foreground children %v", liveForeground)
		}
		if t.Status == arbortype.StatusCompleting && len(liveForeground) == 0 {
			add(3, t.ID, "completing with no live foreground child: it should be completed")
		}
		// 4. a wait (kept after it ends) names only the task's own
		// children; a waiting task's wait is unsatisfied.
		if t.Status != arbortype.StatusWaiting {
			for _, id := range t.WaitIDs {
				if c, ok := byID[id]; !ok || c.OwnerID != t.ID {
					add(4, t.ID, "its wait named %d, which is not its child", id)
				}
			}
		}
		if t.Status == arbortype.StatusWaiting {
			var waited []Task
			for _, id := range t.WaitIDs {
				c, ok := byID[id]
				if !ok || c.OwnerID != t.ID {
					add(4, t.ID, "waits on %d, which is not its child", id)
					continue
				}
				waited = append(waited, *c)
			}
			if t.WaitPolicy != AllSettled && t.WaitPolicy != FailFast {
				add(4, t.ID, "waiting with policy %q", t.WaitPolicy)
			} else if len(t.WaitIDs) == 0 || evaluateWait(t.WaitPolicy, waited).satisfied {
				add(4, t.ID, "waiting (%s on %v) but the wait is satisfied", t.WaitPolicy, t.WaitIDs)
			}
		}
	}
	// 9. one token per start.
	dups, err := e.Store.DuplicateTokens(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	for _, tok := range dups {
		for _, t := range all {
			if t.Token == tok {
				add(9, t.ID, "token %d is held by more than one task", tok)
			}
		}
	}
	// 5. exactly one live wake job per sleep, none left for a finished one.
	jobs, err := e.Store.LiveWakeJobs(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	undelivered, err := e.Store.UndeliveredEvents(ctx, tx, conv)
	if err != nil {
		return nil, err
	}
	out = append(out, sleepViolations(conv, all, jobs, undelivered)...)
	// 10. budgets are the sums of their scopes' reservations.
	bv, err := e.budgetViolations(ctx, tx, conv, byID)
	if err != nil {
		return nil, err
	}
	out = append(out, bv...)
	// 1, 8, 11, 12: the records beside the tasks.
	records, err := e.Store.CheckRecords(ctx, tx, conv, futureSlack, e.Cfg.LogRetention)
	if err != nil {
		return nil, err
	}
	out = append(out, recordViolations(conv, all, byID, records, records.Now.Add(-e.Cfg.LogRetention))...)
	slices.SortStableFunc(out, func(a, b Violation) int { return int(a.TaskID - b.TaskID) })
	return out, nil
}
