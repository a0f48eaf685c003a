package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/tasks"
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
// hold the conversation's row lock (the transaction that takes its lease).
func OnOpen(ctx context.Context, engine *tasks.Engine, tx pgx.Tx, conversationID string) (Report, error) {
	st := engine.Store()
	rep := Report{ConversationID: conversationID}
	running, err := st.TasksInStatus(ctx, tx, conversationID, fsm.Running)
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
			cur, err := engine.GetTx(ctx, tx, t.ID)
			if err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			if cur.Status != fsm.Running {
				continue // aborted with an abandoned owner's subtree
			}
			if _, err := engine.AbandonTx(ctx, tx, t.ID); err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			rep.Abandoned = append(rep.Abandoned, t.ID)
		case t.Attempt+1 > t.RestartLimit:
			cur, err := engine.GetTx(ctx, tx, t.ID)
			if err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			if cur.Status != fsm.Running {
				continue
			}
			if _, err := engine.ForceFailTx(ctx, tx, t.ID, tasks.TaskError{
				Code:    tasks.CodeRestartLimitExceeded,
				Message: fmt.Sprintf("recovered %d times, its restart limit is %d", t.Attempt+1, t.RestartLimit),
			}); err != nil {
				return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
			}
			rep.LimitExceeded = append(rep.LimitExceeded, t.ID)
		default:
			requeue = append(requeue, t.ID)
		}
	}
	if rep.Requeued, err = engine.RequeueManyTx(ctx, tx, requeue); err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	slices.Sort(rep.Requeued)

	waiting, err := st.TasksInStatus(ctx, tx, conversationID, fsm.Waiting)
	if err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	for _, t := range waiting {
		woken, err := engine.RepairWaitTx(ctx, tx, t.ID)
		if err != nil {
			return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
		}
		if woken {
			rep.WaitsWoken = append(rep.WaitsWoken, t.ID)
		}
	}

	completing, err := st.TasksInStatus(ctx, tx, conversationID, fsm.Completing)
	if err != nil {
		return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
	}
	// Deepest first (descending id): completing a child may complete its
	// completing owner in the same call, which then reports false.
	slices.Reverse(completing)
	for _, t := range completing {
		done, err := engine.RepairCompletingTx(ctx, tx, t.ID)
		if err != nil {
			return rep, fmt.Errorf("reconcile %q: %w", conversationID, err)
		}
		if done {
			rep.Completed = append(rep.Completed, t.ID)
		}
	}
	return rep, nil
}

// Generations applies the rule that at most one live generation of a
// conversation runs at a time. roots are the conversation's live root tasks
// (store.LiveRoots); isGeneration says which kinds are generations (nil:
// every root is one). It returns the roots a machine may start now: every
// root that is not a generation, and of the generations either the one
// already under way (started before: woken from a wait or a sleep, or
// requeued by recovery) or, when none is, the oldest pending one
// (NextPendingGeneration). A generation that is waiting or sleeping is under
// way too: the next one waits for it (NextWaitingGeneration names it).
func Generations(roots []tasks.Task, isGeneration func(kind string) bool) (startable []int64) {
	var active, next *tasks.Task
	for i := range roots {
		r := &roots[i]
		if isGeneration != nil && !isGeneration(r.Kind) {
			if r.Status == fsm.Pending {
				startable = append(startable, r.ID)
			}
			continue
		}
		if r.StartedAt != nil && active == nil {
			active = r
		}
		if r.Status == fsm.Pending && r.StartedAt == nil && next == nil {
			next = r
		}
	}
	switch {
	case active != nil && active.Status == fsm.Pending:
		startable = append(startable, active.ID)
	case active == nil && next != nil:
		startable = append(startable, next.ID)
	}
	slices.Sort(startable)
	return startable
}

// NextPendingGeneration returns the oldest pending generation that never
// ran, or nil: the turn a machine starts when no generation is under way.
func NextPendingGeneration(roots []tasks.Task, isGeneration func(kind string) bool) *tasks.Task {
	for i := range roots {
		r := &roots[i]
		if (isGeneration == nil || isGeneration(r.Kind)) && r.Status == fsm.Pending && r.StartedAt == nil {
			return r
		}
	}
	return nil
}

// NextWaitingGeneration returns the oldest generation parked in a wait or a
// sleep, or nil: the turn under way that a machine leaves parked, and that
// holds later generations back until it settles.
func NextWaitingGeneration(roots []tasks.Task, isGeneration func(kind string) bool) *tasks.Task {
	for i := range roots {
		r := &roots[i]
		if (isGeneration == nil || isGeneration(r.Kind)) && (r.Status == fsm.Waiting || r.Status == fsm.Sleeping) {
			return r
		}
	}
	return nil
}
