package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// Report says what OnOpen did to a conversation, task by task.
type Report struct {
	ConversationID string
	// Requeued went from running back to pending with attempt + 1.
	Requeued []int64
	// Abandoned were abandon_on_restart tasks, settled cancelled.
	Abandoned []int64
	// LimitExceeded were failed with restart_limit_exceeded.
	LimitExceeded []int64
	// WaitsWoken were waiting tasks whose wait was found satisfied.
	WaitsWoken []int64
	// Completed were completing tasks whose children had all settled.
	Completed []int64
}

// Empty reports whether OnOpen found nothing to do.
func (r Report) Empty() bool {
	return len(r.Requeued)+len(r.Abandoned)+len(r.LimitExceeded)+len(r.WaitsWoken)+len(r.Completed) == 0
}

// LogValue makes a Report a structured slog value: the count per outcome.
func (r Report) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("conversation_id", r.ConversationID),
		slog.Int("requeued", len(r.Requeued)),
		slog.Int("abandoned", len(r.Abandoned)),
		slog.Int("restart_limit_exceeded", len(r.LimitExceeded)),
		slog.Int("waits_woken", len(r.WaitsWoken)),
		slog.Int("completed", len(r.Completed)),
	)
}

func (r Report) String() string {
	return fmt.Sprintf("conversation %s: requeued %v, abandoned %v, restart limit exceeded %v, waits woken %v, completed %v",
		r.ConversationID, r.Requeued, r.Abandoned, r.LimitExceeded, r.WaitsWoken, r.Completed)
}

// OnOpen runs reconcile_on_open for a conversation inside tx, which must
// hold the conversation's row lock (the transaction that takes its lease):
// RecoverRunning, then the repair of waits and completing tasks.
func OnOpen(ctx context.Context, engine *core.Engine, tx pgx.Tx, conversationID string) (Report, error) {
	rep, err := RecoverRunning(ctx, engine, tx, conversationID)
	if err != nil {
		return rep, err
	}
	return rep, repair(ctx, engine, tx, &rep)
}

// RecoverRunning recovers the running tasks of a conversation whose runs
// are over (their holder died, or is releasing the conversation): each goes
// back to pending with attempt + 1, or is abandoned (abandon_on_restart) or
// failed (past its restart limit). tx must hold the conversation's row lock.
// A release runs it so that no run of the releasing holder can write after
// the release commits.
func RecoverRunning(ctx context.Context, engine *core.Engine, tx pgx.Tx, conversationID string) (Report, error) {
	rep := Report{ConversationID: conversationID}
	running, err := engine.Store.TasksInStatus(ctx, tx, conversationID, arbortype.StatusRunning)
	if err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	// Tasks that must not simply run again settle first, one by one (an
	// abandon aborts a subtree and reconciles owners); the rest are
	// requeued in one statement, which skips any that a settle above
	// already took out of running.
	var requeue []int64
	for _, t := range running {
		switch {
		case t.AbandonOnRestart:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue // aborted with an abandoned owner's subtree
			}
			if _, err := engine.Abandon(ctx, tx, t.ID); err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			rep.Abandoned = append(rep.Abandoned, t.ID)
		case t.Attempt+1 > t.RestartLimit:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue
			}
			if _, err := engine.ForceFail(ctx, tx, t.ID, arbortype.TaskError{
				Code:    core.CodeRestartLimitExceeded,
				Message: fmt.Sprintf("recovered %d times, its restart limit is %d", t.Attempt+1, t.RestartLimit),
			}); err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			rep.LimitExceeded = append(rep.LimitExceeded, t.ID)
		default:
			requeue = append(requeue, t.ID)
		}
	}
	if rep.Requeued, err = engine.RequeueMany(ctx, tx, requeue); err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	slices.Sort(rep.Requeued)
	return rep, nil
}

// repair re-checks the conversation's waits and completing tasks.
func repair(ctx context.Context, engine *core.Engine, tx pgx.Tx, rep *Report) error {
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
// running tasks read in one, requeued in one (abandon_on_restart tasks and
// those past their restart limit settled one by one, as OnOpen does), and
// the waits and completing tasks to repair found in one (there are none
// unless something wrote behind the engine's back) and repaired one by one.
// tx must hold the conversations' row locks. Reports come back in the order
// of convs; a conversation with nothing to recover has an empty one.
func OnOpenMany(ctx context.Context, engine *core.Engine, tx pgx.Tx, convs []string) ([]Report, error) {
	reps := make([]Report, len(convs))
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
	var requeue []int64
	conv := map[int64]string{}
	for _, t := range running {
		rep := &reps[at[t.ConversationID]]
		switch {
		case t.AbandonOnRestart:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue
			}
			if _, err := engine.Abandon(ctx, tx, t.ID); err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			rep.Abandoned = append(rep.Abandoned, t.ID)
		case t.Attempt+1 > t.RestartLimit:
			cur, err := engine.Get(ctx, tx, t.ID)
			if err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			if cur.Status != arbortype.StatusRunning {
				continue
			}
			if _, err := engine.ForceFail(ctx, tx, t.ID, arbortype.TaskError{
				Code:    core.CodeRestartLimitExceeded,
				Message: fmt.Sprintf("recovered %d times, its restart limit is %d", t.Attempt+1, t.RestartLimit),
			}); err != nil {
				return reps, fmt.Errorf("reconcile %q: %w", t.ConversationID, err)
			}
			rep.LimitExceeded = append(rep.LimitExceeded, t.ID)
		default:
			requeue = append(requeue, t.ID)
			conv[t.ID] = t.ConversationID
		}
	}
	moved, err := engine.RequeueMany(ctx, tx, requeue)
	if err != nil {
		return reps, fmt.Errorf("reconcile %d conversations: %w", len(convs), err)
	}
	for _, id := range moved {
		rep := &reps[at[conv[id]]]
		rep.Requeued = append(rep.Requeued, id)
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
	}
	return reps, nil
}
