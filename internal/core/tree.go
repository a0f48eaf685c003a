package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// The tree machinery shared by complete, fail, cancel, abort and wait. Every
// function here runs inside a transaction that already holds the
// conversation's row lock (see doc.go).

// lockConversationOf locks the conversation of taskID and then the task
// itself: the first two locks of every multi-task operation.
func (e *Engine) lockConversationOf(ctx context.Context, tx pgx.Tx, taskID int64) (Task, error) {
	c, err := e.Store.LockConversationOfTask(ctx, tx, taskID)
	if err != nil {
		if store.IsNoRows(err) {
			return Task{}, arbortype.ErrNotFound
		}
		return Task{}, err
	}
	return e.Store.LockTask(ctx, tx, c.ID, taskID)
}

// settle moves the locked, live task t to its settled status through event,
// then reconciles its owner. result and taskErr are recorded when not nil.
func (e *Engine) settle(ctx context.Context, tx pgx.Tx, t Task, event fsm.Event, result json.RawMessage, taskErr *TaskError) (Task, error) {
	to, err := fsm.Transition(t.Status, event)
	if err != nil {
		return Task{}, transitionError(t.ID, t.Status, event)
	}
	if err := e.dropWakeJobs(ctx, tx, t); err != nil {
		return Task{}, err
	}
	settled, err := e.Store.SettleTask(ctx, tx, t.ConversationID, t.ID, to, result, taskErr)
	if err != nil {
		return Task{}, mapDBError(err)
	}
	if err := e.reconcileOwner(ctx, tx, settled); err != nil {
		return Task{}, err
	}
	return settled, nil
}

// settleFailed settles the locked, live task t as failed with taskErr,
// recorded in its error history in the same statement, then reconciles its
// owner.
func (e *Engine) settleFailed(ctx context.Context, tx pgx.Tx, t Task, taskErr *TaskError) (Task, error) {
	to, err := fsm.Transition(t.Status, fsm.Fail)
	if err != nil {
		return Task{}, transitionError(t.ID, t.Status, fsm.Fail)
	}
	if err := e.dropWakeJobs(ctx, tx, t); err != nil {
		return Task{}, err
	}
	settled, err := e.Store.SettleFailedTask(ctx, tx, t.ConversationID, t.ID, to, taskErr, e.Cfg.ErrorHistoryLimit)
	if err != nil {
		return Task{}, mapDBError(err)
	}
	if err := e.reconcileOwner(ctx, tx, settled); err != nil {
		return Task{}, err
	}
	return settled, nil
}

// reconcileOwner applies what the settling of child means for its owner,
// and so on up the tree (docs/design.md §3.5):
//   - a waiting owner whose wait names child is re-evaluated: it wakes when
//     its wait is satisfied, and under fail_fast a child that did not
//     complete aborts the other live waited children first;
//   - a completing owner whose last live foreground child this was becomes
//     completed, and its own owner is reconciled in turn.
func (e *Engine) reconcileOwner(ctx context.Context, tx pgx.Tx, child Task) error {
	for child.OwnerID != 0 {
		owner, err := e.Store.LockTask(ctx, tx, child.ConversationID, child.OwnerID)
		if err != nil {
			return err
		}
		switch owner.Status {
		case arbortype.StatusWaiting:
			if !slices.Contains(owner.WaitIDs, child.ID) {
				return nil
			}
			_, err := e.applyWait(ctx, tx, owner, &child)
			return err
		case arbortype.StatusCompleting:
			if child.Background {
				return nil
			}
			live, err := e.Store.HasLiveForegroundChildren(ctx, tx, owner.ConversationID, owner.ID)
			if err != nil || live {
				return err
			}
			to, err := fsm.Transition(owner.Status, fsm.Complete)
			if err != nil {
				return err
			}
			if child, err = e.Store.SettleTask(ctx, tx, owner.ConversationID, owner.ID, to, nil, nil); err != nil {
				return mapDBError(err)
			}
		default:
			return nil
		}
	}
	return nil
}

// waitOutcome is what a wait's children say about it.
type waitOutcome struct {
	satisfied bool
	// failFastBy is the waited child that tripped fail_fast (0: none).
	failFastBy int64
	// live are the waited children still live.
	live []int64
}

func evaluateWait(policy WaitPolicy, children []Task) waitOutcome {
	var out waitOutcome
	for _, c := range children {
		switch {
		case c.Status.Live():
			out.live = append(out.live, c.ID)
		case policy == FailFast && c.Status != arbortype.StatusCompleted && (out.failFastBy == 0 || c.SettleSeq < seqOf(children, out.failFastBy)):
			out.failFastBy = c.ID
		}
	}
	out.satisfied = len(out.live) == 0 || out.failFastBy != 0
	return out
}

func seqOf(children []Task, id int64) int64 {
	for _, c := range children {
		if c.ID == id {
			return c.SettleSeq
		}
	}
	return 0
}

// applyWait re-evaluates the wait of owner, a locked waiting task, and
// applies it: under fail_fast the live waited children are aborted
// (bottom-up) when one did not complete, and the owner is woken when the
// wait is satisfied. It reports whether the owner was woken.
//
// settled is the waited child whose settling prompted this, or nil to
// evaluate the whole wait from scratch (recovery). With a child, the cost
// does not grow with the number of children: a waiting owner was not
// satisfied before this child settled, so under fail_fast only this child
// can have tripped it, and otherwise only "is any waited child still live?"
// is left to ask.
func (e *Engine) applyWait(ctx context.Context, tx pgx.Tx, owner Task, settled *Task) (bool, error) {
	tripped := false
	if settled != nil {
		tripped = owner.WaitPolicy == FailFast && settled.Status != arbortype.StatusCompleted
		if !tripped {
			live, err := e.Store.HasLiveWaitedChildren(ctx, tx, owner.ConversationID, owner.ID, owner.WaitIDs)
			if err != nil || live {
				return false, err
			}
		}
	} else {
		children, err := e.Store.GetTasks(ctx, tx, owner.WaitIDs)
		if err != nil {
			return false, err
		}
		out := evaluateWait(owner.WaitPolicy, children)
		if !out.satisfied {
			return false, nil
		}
		tripped = out.failFastBy != 0
	}
	if tripped {
		// LockLiveSubtrees takes the live ones among the waited ids.
		if _, err := e.abortSubtrees(ctx, tx, owner.ConversationID, owner.WaitIDs); err != nil {
			return false, err
		}
	}
	to, err := fsm.Transition(owner.Status, fsm.Wake)
	if err != nil {
		return false, err
	}
	if _, err := e.Store.WakeTask(ctx, tx, owner.ConversationID, owner.ID, to); err != nil {
		return false, mapDBError(err)
	}
	return true, nil
}

// AbortChunk bounds the tasks one statement of an abort locks or settles,
// so that what the client does between two statements of the abort's
// transaction — and so the time the transaction sits idle in it, which
// Cfg.IdleInTransaction bounds — does not grow with the subtree
// (docs/design.md §3.6).
const AbortChunk = 500

// abortSubtrees settles each live task of rootIDs with its live foreground
// descendants, leaves first: every task is marked abort_requested and
// settled aborted (or orphaned, for a pending task that never ran), each
// child before its owner, in statements of at most AbortChunk tasks whose
// settle order is recorded. Owners outside the subtrees are not
// reconciled: the caller does that for the roots it aborted. It returns
// the tasks it settled, roots included, as written (status, settle_seq,
// settled_at, error), in their settle order: leaves first.
func (e *Engine) abortSubtrees(ctx context.Context, tx pgx.Tx, conv string, rootIDs []int64) ([]Task, error) {
	return e.abortSubtreesWhy(ctx, tx, conv, rootIDs, nil)
}

// abortSubtreesWhy is abortSubtrees recording why on the roots (nil:
// nothing).
func (e *Engine) abortSubtreesWhy(ctx context.Context, tx pgx.Tx, conv string, rootIDs []int64, why *TaskError) ([]Task, error) {
	ids, err := e.Store.LiveSubtreeIDs(ctx, tx, conv, rootIDs)
	if err != nil {
		return nil, err
	}
	nodes, err := e.lockLive(ctx, tx, conv, ids)
	if err != nil {
		return nil, err
	}
	return e.abortLockedWhy(ctx, tx, conv, nodes, rootIDs, why)
}

// lockLive locks the live tasks among ids (ascending) in id order,
// AbortChunk at a time, and returns them as locked.
func (e *Engine) lockLive(ctx context.Context, tx pgx.Tx, conv string, ids []int64) ([]Task, error) {
	nodes := make([]Task, 0, len(ids))
	for chunk := range slices.Chunk(ids, AbortChunk) {
		locked, err := e.Store.LockLiveTasks(ctx, tx, conv, chunk)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, locked...)
	}
	return nodes, nil
}

// abortLockedWhy settles the locked live tasks of nodes (ascending id)
// leaves first, in descending id order (an owner's id is always smaller
// than its children's), AbortChunk tasks per statement, recording why
// (nil: nothing) as the error of those among them that are in roots. It
// returns the rows as settled, in that order.
func (e *Engine) abortLockedWhy(ctx context.Context, tx pgx.Tx, conv string, nodes []Task, roots []int64, why *TaskError) ([]Task, error) {
	var reasons []int64
	if why != nil {
		reasons = roots
	}
	// The edge of each (status, event) is asked of the state machine
	// once: fsm.Transition builds a machine per call, which costs more
	// than the rest of the abort's own work between two statements.
	type edge struct {
		from  arbortype.Status
		event fsm.Event
	}
	edges := map[edge]arbortype.Status{}
	settled := make([]Task, 0, len(nodes))
	for end := len(nodes); end > 0; end -= AbortChunk {
		chunk := nodes[max(0, end-AbortChunk):end]
		if err := e.dropWakeJobs(ctx, tx, chunk...); err != nil {
			return nil, err
		}
		ids := make([]int64, 0, len(chunk))
		statuses := make([]arbortype.Status, 0, len(chunk))
		for i := len(chunk) - 1; i >= 0; i-- {
			n := chunk[i]
			event := fsm.Abort
			if n.Status == arbortype.StatusPending && n.StartedAt == nil {
				event = fsm.Orphan
			}
			to, ok := edges[edge{n.Status, event}]
			if !ok {
				var err error
				if to, err = fsm.Transition(n.Status, event); err != nil {
					return nil, transitionError(n.ID, n.Status, event)
				}
				edges[edge{n.Status, event}] = to
			}
			ids = append(ids, n.ID)
			statuses = append(statuses, to)
		}
		done, err := e.Store.AbortMany(ctx, tx, conv, ids, statuses, reasons, why)
		if err != nil {
			return nil, mapDBError(err)
		}
		if len(done) != len(ids) {
			return nil, fmt.Errorf("abort settled %d of the %d tasks it locked", len(done), len(ids))
		}
		settled = append(settled, done...)
	}
	return settled, nil
}

// abortForegroundChildren aborts the live foreground children of t, each
// with its subtree; t itself is not touched.
func (e *Engine) abortForegroundChildren(ctx context.Context, tx pgx.Tx, t Task) error {
	children, err := e.Store.LiveChildren(ctx, tx, t.ConversationID, t.ID)
	if err != nil {
		return err
	}
	var ids []int64
	for _, c := range children {
		if !c.Background {
			ids = append(ids, c.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, err = e.abortSubtrees(ctx, tx, t.ConversationID, ids)
	return err
}

func errorf(op string, taskID int64, err error) error {
	return fmt.Errorf("%s task %d: %w", op, taskID, err)
}
