package recovery

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/reconcile"
)

// OnOpen runs reconcile_on_open for a conversation inside tx, which must
// hold the conversation's row lock (the transaction that takes its lease):
// RecoverRunning, then the repair of waits and completing tasks. counted
// says whether the runs it recovers count as restarts (see RecoverRunning).
func OnOpen(ctx context.Context, engine *core.Engine, tx pgx.Tx, conversationID string, counted bool) (reconcile.Report, error) {
	rep, err := RecoverRunning(ctx, engine, tx, conversationID, counted, nil)
	if err != nil {
		return rep, err
	}
	return rep, repair(ctx, engine, tx, &rep)
}

// RecoverRunning recovers the running tasks of a conversation whose runs
// are over (their holder died, lost its lease, or is releasing the
// conversation): each goes back to pending, or is abandoned
// (abandon_on_restart: its run was cut, and might have done its side
// effect). counted says the runs' holder died or lost its lease while
// running them (docs/design.md §3.8): their attempt grows by one, and a
// task past its restart limit fails instead. A holder's own release, or a
// take-over of a holder lapsed by a database restart, counts nothing.
// uncalled (nil: none) says which runs, by token, the recovering runner
// claimed and never handed to a handler: those are requeued, uncounted,
// whatever their kind (see Uncalled). tx must hold the conversation's row
// lock. A release runs it so that no run of the releasing holder can write
// after the release commits.
func RecoverRunning(ctx context.Context, engine *core.Engine, tx pgx.Tx, conversationID string, counted bool, uncalled Uncalled) (reconcile.Report, error) {
	rep := reconcile.Report{ConversationID: conversationID}
	running, err := engine.Store.TasksInStatus(ctx, tx, conversationID, arbortype.StatusRunning)
	if err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	reps := []reconcile.Report{rep}
	if err := recoverRuns(ctx, engine, tx, running, func(string) (*reconcile.Report, bool) { return &reps[0], counted }, uncalled); err != nil {
		return reps[0], err
	}
	slices.Sort(reps[0].Requeued)
	slices.Sort(reps[0].Restarted)
	return reps[0], nil
}

// RecoverTasks recovers, as RecoverRunning does but never counted, those of
// a conversation's running tasks that still run under the token given
// (tokens: task id → token); the others (settled, requeued or claimed
// again meanwhile) are left alone. tx must hold the conversation's row
// lock. The runner's audit uses it for runs its node lost track of.
func RecoverTasks(ctx context.Context, engine *core.Engine, tx pgx.Tx, conversationID string, tokens map[int64]int64, uncalled Uncalled) (reconcile.Report, error) {
	rep := reconcile.Report{ConversationID: conversationID}
	running, err := engine.Store.TasksInStatus(ctx, tx, conversationID, arbortype.StatusRunning)
	if err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	running = slices.DeleteFunc(running, func(t arbortype.Task) bool {
		tok, ok := tokens[t.ID]
		return !ok || t.Token != tok
	})
	if err := recoverRuns(ctx, engine, tx, running, func(string) (*reconcile.Report, bool) { return &rep, false }, uncalled); err != nil {
		return rep, err
	}
	slices.Sort(rep.Requeued)
	return rep, nil
}

// Uncalled says whether the run of a token was claimed by the recovering
// runner and never handed to a handler: no handler saw it, so it cannot
// have made a side effect, and its recovery neither abandons nor counts it.
type Uncalled func(token int64) bool

// recoverRuns recovers running tasks (of conversations tx holds locked):
// the abandon_on_restart ones and, when counted, those past their restart
// limit settle one by one (an abandon aborts a subtree and reconciles
// owners); the rest are requeued in one statement per kind of count, which
// skips any that a settle above already took out of running. of gives the
// report of a task's conversation and whether its recovery counts; a run
// uncalled (nil: none) reports is requeued uncounted.
func recoverRuns(ctx context.Context, engine *core.Engine, tx pgx.Tx, running []arbortype.Task, of func(conv string) (*reconcile.Report, bool), uncalled Uncalled) error {
	var requeue [2][]int64 // [uncounted, counted]
	conv := map[int64]string{}
	for _, t := range running {
		rep, counted := of(t.ConversationID)
		never := uncalled != nil && uncalled(t.Token)
		if never {
			counted = false
		}
		switch {
		case t.AbandonOnRestart && !never:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue // aborted with an abandoned owner's subtree
			}
			if _, err := engine.Abandon(ctx, tx, t.ID); err != nil {
				return fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			rep.Abandoned = append(rep.Abandoned, t.ID)
		case counted && t.Attempt+1 > t.RestartLimit:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue
			}
			if _, err := engine.ForceFail(ctx, tx, t.ID, arbortype.TaskError{
				Code:    arbortype.CodeRestartLimitExceeded,
				Message: fmt.Sprintf("recovered %d times after its holder died or lost its lease; its restart limit is %d", t.Attempt+1, t.RestartLimit),
			}); err != nil {
				return fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			rep.LimitExceeded = append(rep.LimitExceeded, t.ID)
		default:
			i := 0
			if counted {
				i = 1
			}
			requeue[i] = append(requeue[i], t.ID)
			conv[t.ID] = t.ConversationID
		}
	}
	for i, ids := range requeue {
		moved, err := engine.RequeueMany(ctx, tx, ids, i == 1)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		for _, id := range moved {
			rep, _ := of(conv[id])
			rep.Requeued = append(rep.Requeued, id)
			if i == 1 {
				rep.Restarted = append(rep.Restarted, id)
			}
		}
	}
	return nil
}

// repair re-checks the conversation's waits and completing tasks.
func repair(ctx context.Context, engine *core.Engine, tx pgx.Tx, rep *reconcile.Report) error {
	conversationID := rep.ConversationID
	waiting, err := engine.Store.TasksInStatus(ctx, tx, conversationID, arbortype.StatusWaiting)
	if err != nil {
		return fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	for _, t := range waiting {
		woken, err := engine.RepairWait(ctx, tx, t.ConversationID, t.ID)
		if err != nil {
			return fmt.Errorf("reconcile %q: %w", conversationID, err)
		}
		if woken {
			rep.WaitsWoken = append(rep.WaitsWoken, t.ID)
		}
	}

	completing, err := engine.Store.TasksInStatus(ctx, tx, conversationID, arbortype.StatusCompleting)
	if err != nil {
		return fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	// Deepest first (descending id): completing a child may complete its
	// completing owner in the same call, which then reports false.
	slices.Reverse(completing)
	for _, t := range completing {
		done, err := engine.RepairCompleting(ctx, tx, t.ConversationID, t.ID)
		if err != nil {
			return fmt.Errorf("reconcile %q: %w", conversationID, err)
		}
		if done {
			rep.Completed = append(rep.Completed, t.ID)
		}
	}
	return nil
}

// OnOpenMany is OnOpen for many conversations taken in one transaction (a
// node's claim), at the cost of a few statements for all of them: their
// running tasks read in one, requeued in one per kind of count
// (abandon_on_restart tasks and those past their restart limit settled one
// by one, as OnOpen does), and the waits and completing tasks to repair
// found in one (there are none unless something wrote behind the engine's
// back) and repaired one by one. counted says, by conversation, whether its
// recovered runs count as restarts; uncalled, as for RecoverRunning, which
// runs the recovering runner never handed to a handler. tx must hold the conversations' row
// locks. Reports come back in the order of convs; a conversation with
// nothing to recover has an empty one.
func OnOpenMany(ctx context.Context, engine *core.Engine, tx pgx.Tx, convs []string, counted func(conv string) bool, uncalled Uncalled) ([]reconcile.Report, error) {
	reps := make([]reconcile.Report, len(convs))
	at := make(map[string]int, len(convs))
	for i, c := range convs {
		reps[i].ConversationID = c
		at[c] = i
	}
	if len(convs) == 0 {
		return reps, nil
	}
	running, err := engine.Store.RunningIn(ctx, tx, convs)
	if err != nil {
		return reps, fmt.Errorf("reconcile %d conversations: %w", len(convs), err)
	}
	if err := recoverRuns(ctx, engine, tx, running, func(c string) (*reconcile.Report, bool) { return &reps[at[c]], counted(c) }, uncalled); err != nil {
		return reps, err
	}
	ids, statuses, err := engine.Store.ToRepair(ctx, tx, convs)
	if err != nil {
		return reps, fmt.Errorf("reconcile %d conversations: %w", len(convs), err)
	}
	for i, id := range ids {
		t, err := engine.Get(ctx, tx, id)
		if err != nil {
			return reps, fmt.Errorf("reconcile: %w", err)
		}
		rep := &reps[at[t.ConversationID]]
		switch statuses[i] {
		case arbortype.StatusWaiting:
			woken, err := engine.RepairWait(ctx, tx, t.ConversationID, id)
			if err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if woken {
				rep.WaitsWoken = append(rep.WaitsWoken, id)
			}
		case arbortype.StatusCompleting:
			done, err := engine.RepairCompleting(ctx, tx, t.ConversationID, id)
			if err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if done {
				rep.Completed = append(rep.Completed, id)
			}
		}
	}
	for i := range reps {
		slices.Sort(reps[i].Requeued)
		slices.Sort(reps[i].Restarted)
	}
	return reps, nil
}
