package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// The batching completer's transaction (see package machine's doc): the
// outcomes of many runs applied together in a handful of statements, with
// the same rules, checks and results as the one-by-one operations
// (Complete, Fail, WaitForChildren, SleepUntil, CreateMany).
//
// Locking: the outcomes' conversations first, in id order (one statement),
// then task rows: the spawns' owners and the waits' tasks in id order, the
// completes' rows by their UPDATE, owners as the reconcile reaches them.
// Every user operation on these conversations waits for the flush, so the
// statements see a consistent tree.
//
// What the set-based statements do not cover (a completion with live
// foreground children, a failure, a sleep, a fail_fast wait that trips
// with live siblings) is applied one outcome at a time, each under a
// savepoint, by the one-by-one operations. A set-based statement that fails
// fails the flush; the caller then runs the batch again with every outcome
// on the one-by-one path (slow), where a refusal is that outcome's alone —
// but a deadlock or a serialization failure, which is the transaction's:
// it fails the flush, which Tx runs again.

// OutcomeKind says what a run's outcome is.
type OutcomeKind int

const (
	OutComplete OutcomeKind = iota
	OutFail
	OutWait
	OutSleep
	OutSpawn
	OutAwait
)

// Outcome is a run's write queued to the completer.
type Outcome struct {
	Kind           OutcomeKind
	TaskID, Token  int64
	ConversationID string
	// Result of a completion.
	Result json.RawMessage
	// Error of a failure.
	Error TaskError
	// Wait of a wait.
	Wait WaitParams
	// WakeAt, Phase and State of a sleep.
	WakeAt time.Time
	Phase  string
	State  json.RawMessage
	// Spawns are the children of a spawn (their owner is TaskID, fenced by
	// Token).
	Spawns []CreateParams
	// Await of an await.
	Await AwaitParams
}

// OutcomeResult is what one outcome came to.
type OutcomeResult struct {
	// Woken: a wait found satisfied, the task woken at once.
	Woken bool
	// Children of a spawn, in the order asked.
	Children []Task
	// Err is the outcome's own refusal (fenced off, bad input); nil when it
	// applied.
	Err error
}

// FlushResult is what a flush did.
type FlushResult struct {
	Results []OutcomeResult // same index as the outcomes
	Claimed []Task          // runs started in the flush's held conversations
	// Deferred are the outcomes (indexes) the flush did not apply: their
	// conversation was locked by another transaction, and the flush skips
	// it rather than wait (they go in a later flush).
	Deferred []int
}

// Flush applies outs in tx and claims, in the conversations holder still
// holds among theirs, up to claim.Limit runnable tasks (claim.Conversations
// is set by Flush). With slow, every outcome goes the one-by-one path.
// *xact receives the transaction's id, from its first statement, so that a
// commit whose outcome is unknown can be resolved (XactCommitted).
//
// more, if not nil, is asked once the outcomes are applied, and before the
// claim, for outcomes that came meanwhile in the conversations the flush
// has locked (given sorted): those are applied in the same transaction,
// their results appended to FlushResult.Results in the order given, and
// more is asked again until it has none. An outcome that comes while a
// flush holds its conversation so goes in that flush's commit instead of
// a flush of its own that would find the conversation locked and skip it.
func (e *Engine) Flush(ctx context.Context, tx pgx.Tx, outs []Outcome, claim ClaimParamsFor, slow bool, xact *int64, more func(locked []string) []Outcome) (FlushResult, error) {
	res := FlushResult{Results: make([]OutcomeResult, len(outs))}
	convSet := map[string]bool{}
	for _, o := range outs {
		convSet[o.ConversationID] = true
	}
	convs := make([]string, 0, len(convSet))
	for c := range convSet {
		convs = append(convs, c)
	}
	slices.Sort(convs)
	held, id, err := e.Store.LockForFlush(ctx, tx, convs, claim.Holder)
	*xact = id
	if err != nil {
		return res, fmt.Errorf("flush: lock conversations: %w", err)
	}
	// held has the conversations locked; the others were skipped.
	var apply []int
	for i, o := range outs {
		if _, locked := held[o.ConversationID]; locked {
			apply = append(apply, i)
		} else {
			res.Deferred = append(res.Deferred, i)
		}
	}
	if err := e.applyOutcomes(ctx, tx, outs, apply, slow, &res); err != nil {
		return res, err
	}
	if more != nil && len(held) > 0 {
		locked := make([]string, 0, len(held))
		for _, c := range convs {
			if _, ok := held[c]; ok {
				locked = append(locked, c)
			}
		}
		for {
			extra := more(locked)
			if len(extra) == 0 {
				break
			}
			idx := make([]int, len(extra))
			for i, o := range extra {
				if _, ok := held[o.ConversationID]; !ok {
					return res, fmt.Errorf("flush: an outcome of conversation %q came for a flush that has not locked it", o.ConversationID)
				}
				idx[i] = len(outs) + i
			}
			outs = append(outs, extra...)
			res.Results = append(res.Results, make([]OutcomeResult, len(extra))...)
			if err := e.applyOutcomes(ctx, tx, outs, idx, slow, &res); err != nil {
				return res, err
			}
		}
	}

	var heldConvs []string
	for _, c := range convs {
		if held[c] {
			heldConvs = append(heldConvs, c)
		}
	}
	if len(heldConvs) > 0 && claim.Limit > 0 {
		claim.Conversations = heldConvs
		if res.Claimed, _, err = e.ClaimFor(ctx, tx, claim); err != nil {
			return res, fmt.Errorf("flush: %w", err)
		}
	}
	return res, nil
}

// applyOutcomes applies the outcomes outs[i] for i in apply (their
// conversations locked by the flush): by the set-based statements, or
// with slow, each by its one-by-one operation under a savepoint.
func (e *Engine) applyOutcomes(ctx context.Context, tx pgx.Tx, outs []Outcome, apply []int, slow bool, res *FlushResult) error {
	var slowIdx []int
	if slow {
		slowIdx = apply
	} else {
		var spawns, waits, completes []int
		for _, i := range apply {
			o := outs[i]
			switch o.Kind {
			case OutSpawn:
				spawns = append(spawns, i)
			case OutWait:
				waits = append(waits, i)
			case OutComplete:
				completes = append(completes, i)
			default:
				slowIdx = append(slowIdx, i)
			}
		}
		if err := e.flushSpawns(ctx, tx, outs, spawns, res); err != nil {
			return err
		}
		waitSlow, err := e.flushWaits(ctx, tx, outs, waits, res)
		if err != nil {
			return err
		}
		slowIdx = append(slowIdx, waitSlow...)
		completeSlow, settled, err := e.flushCompletes(ctx, tx, outs, completes, res)
		if err != nil {
			return err
		}
		slowIdx = append(slowIdx, completeSlow...)
		if err := e.reconcileOwners(ctx, tx, settled); err != nil {
			return err
		}
	}
	slices.Sort(slowIdx)
	for _, i := range slowIdx {
		r := e.applyOne(ctx, tx, outs[i])
		if retryable(r.Err) {
			// A deadlock or a serialization failure is the transaction's,
			// not the outcome's: the flush runs again (Tx), as after one
			// in a set-based statement. Concurrency limits make deadlocks
			// possible (docs/design.md §3.15): an outcome's end gives back
			// its slots, locking the limits of its keys, after another
			// outcome's end or before the claim's starts took others.
			return fmt.Errorf("flush: task %d: %w", outs[i].TaskID, r.Err)
		}
		res.Results[i] = r
	}
	return nil
}

// applyOne applies one outcome by its one-by-one operation, under a
// savepoint: a refusal, even one the database makes, is its own.
func (e *Engine) applyOne(ctx context.Context, tx pgx.Tx, o Outcome) OutcomeResult {
	r, err := Savepoint(ctx, tx, func(tx pgx.Tx) (OutcomeResult, error) { return e.Apply(ctx, tx, o) })
	r.Err = err
	return r
}

// Apply applies one outcome in tx by its one-by-one operation: what a run
// outside a runner (a Lease's) does for each write.
func (e *Engine) Apply(ctx context.Context, tx pgx.Tx, o Outcome) (OutcomeResult, error) {
	var (
		r   OutcomeResult
		err error
	)
	switch o.Kind {
	case OutComplete:
		_, err = e.Complete(ctx, tx, o.TaskID, o.Token, o.Result)
	case OutFail:
		token := o.Token
		_, err = e.Fail(ctx, tx, o.TaskID, &token, o.Error)
	case OutWait:
		var w WaitResult
		w, err = e.WaitForChildren(ctx, tx, o.TaskID, o.Token, o.Wait)
		r.Woken = w.Woken
	case OutSleep:
		_, err = e.SleepUntil(ctx, tx, o.TaskID, o.Token, o.WakeAt, o.Phase, o.State)
	case OutSpawn:
		r.Children, _, err = e.CreateMany(ctx, tx, o.Spawns)
	case OutAwait:
		var a AwaitResult
		a, err = e.AwaitEvent(ctx, tx, o.TaskID, o.Token, o.Await)
		r.Woken = a.Woken
	default:
		err = fmt.Errorf("apply: outcome kind %d: %w", o.Kind, arbortype.ErrInvalidArgument)
	}
	return r, err
}

// flushCompletes settles in one statement the completions that need
// nothing else (running under their token, not being aborted, no live
// foreground child); it returns the others, for the one-by-one path, and
// the settled tasks, whose owners are then reconciled.
func (e *Engine) flushCompletes(ctx context.Context, tx pgx.Tx, outs []Outcome, idx []int, res *FlushResult) ([]int, []store.Settled, error) {
	if len(idx) == 0 {
		return nil, nil, nil
	}
	var ids, tokens []int64
	var results []*string
	var valid []int
	for _, i := range idx {
		o := outs[i]
		if err := e.checkJSON("result", o.Result); err != nil {
			res.Results[i].Err = errorf("complete", o.TaskID, err)
			continue
		}
		var r *string
		if len(o.Result) > 0 {
			s := string(o.Result)
			r = &s
		}
		ids, tokens, results = append(ids, o.TaskID), append(tokens, o.Token), append(results, r)
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return nil, nil, nil
	}
	to, err := fsm.Transition(arbortype.StatusRunning, fsm.Complete)
	if err != nil {
		return nil, nil, err
	}
	settled, err := e.Store.CompleteMany(ctx, tx, ids, tokens, results, to)
	if err != nil {
		return nil, nil, fmt.Errorf("flush: complete: %w", mapDBError(err))
	}
	done := make(map[int64]bool, len(settled))
	for _, s := range settled {
		done[s.ID] = true
	}
	var slow []int
	for _, i := range valid {
		if !done[outs[i].TaskID] {
			slow = append(slow, i) // completing, fenced off, or aborted: Complete says which
		}
	}
	return slow, settled, nil
}

// reconcileOwners applies what the settles mean for their owners, up the
// tree, a level per round: waiting owners whose waits they satisfied wake;
// completing owners whose last foreground child they were complete, and
// their own owners are looked at next.
func (e *Engine) reconcileOwners(ctx context.Context, tx pgx.Tx, settled []store.Settled) error {
	owners := ownersOf(settled)
	wake, err := fsm.Transition(arbortype.StatusWaiting, fsm.Wake)
	if err != nil {
		return err
	}
	complete, err := fsm.Transition(arbortype.StatusCompleting, fsm.Complete)
	if err != nil {
		return err
	}
	for len(owners) > 0 {
		if _, err := e.Store.WakeSatisfied(ctx, tx, owners, wake); err != nil {
			return fmt.Errorf("flush: wake owners: %w", mapDBError(err))
		}
		done, err := e.Store.CompleteHeld(ctx, tx, owners, complete)
		if err != nil {
			return fmt.Errorf("flush: complete owners: %w", mapDBError(err))
		}
		owners = ownersOf(done)
	}
	return nil
}

func ownersOf(settled []store.Settled) []int64 {
	var owners []int64
	for _, s := range settled {
		if s.OwnerID != 0 {
			owners = append(owners, s.OwnerID)
		}
	}
	slices.Sort(owners)
	return slices.Compact(owners)
}
