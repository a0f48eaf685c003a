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
// on the one-by-one path (slow), where a refusal is that outcome's alone.

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
func (e *Engine) Flush(ctx context.Context, tx pgx.Tx, outs []Outcome, claim ClaimParamsFor, slow bool, xact *int64) (FlushResult, error) {
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
		if err := e.flushSpawns(ctx, tx, outs, spawns, &res); err != nil {
			return res, err
		}
		waitSlow, err := e.flushWaits(ctx, tx, outs, waits, &res)
		if err != nil {
			return res, err
		}
		slowIdx = append(slowIdx, waitSlow...)
		completeSlow, settled, err := e.flushCompletes(ctx, tx, outs, completes, &res)
		if err != nil {
			return res, err
		}
		slowIdx = append(slowIdx, completeSlow...)
		if err := e.reconcileOwners(ctx, tx, settled); err != nil {
			return res, err
		}
	}
	slices.Sort(slowIdx)
	for _, i := range slowIdx {
		res.Results[i] = e.applyOne(ctx, tx, outs[i])
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

// flushSpawns creates the children of every spawn in three statements: the
// owners locked and checked (each spawn fenced by its run's token), the
// idempotency keys looked up, the new children inserted.
func (e *Engine) flushSpawns(ctx context.Context, tx pgx.Tx, outs []Outcome, idx []int, res *FlushResult) error {
	if len(idx) == 0 {
		return nil
	}
	type child struct {
		out int
		at  int
		p   store.InsertParams
	}
	var (
		owners   []int64
		children []child
		keyConvs []string
		keys     []string
	)
	params := map[int][]store.InsertParams{}
	for _, i := range idx {
		o := outs[i]
		ps := make([]store.InsertParams, len(o.Spawns))
		var bad error
		for j, c := range o.Spawns {
			if c.OwnerID != o.TaskID || c.ConversationID != o.ConversationID || c.IdempotencyKey == "" {
				bad = fmt.Errorf("spawn under task %d: child %d is not the run's own: %w", o.TaskID, j, arbortype.ErrInvalidArgument)
				break
			}
			p, err := e.createParams(c)
			if err != nil {
				bad = fmt.Errorf("spawn under task %d: child %d: %w", o.TaskID, j, err)
				break
			}
			ps[j] = p
		}
		if bad != nil {
			res.Results[i].Err = bad
			continue
		}
		params[i] = ps
		owners = append(owners, o.TaskID)
		for j, p := range ps {
			children = append(children, child{out: i, at: j, p: p})
			keyConvs, keys = append(keyConvs, p.ConversationID), append(keys, p.IdempotencyKey)
		}
	}
	if len(owners) == 0 {
		return nil
	}
	slices.Sort(owners)
	owners = slices.Compact(owners)
	states, err := e.Store.LockOwners(ctx, tx, owners)
	if err != nil {
		return fmt.Errorf("flush: spawn: %w", err)
	}
	byOwner := make(map[int64]store.OwnerState, len(states))
	for _, s := range states {
		byOwner[s.ID] = s
	}
	existing, err := e.Store.TasksByKeys(ctx, tx, keyConvs, keys)
	if err != nil {
		return fmt.Errorf("flush: spawn: %w", err)
	}
	byKey := make(map[[2]string]Task, len(existing))
	for _, t := range existing {
		byKey[[2]string{t.ConversationID, t.IdempotencyKey}] = t
	}
	refused := map[int]bool{}
	for _, i := range idx {
		if _, ok := params[i]; !ok {
			continue
		}
		o := outs[i]
		st, ok := byOwner[o.TaskID]
		if !ok {
			res.Results[i].Err = errorf("spawn under", o.TaskID, arbortype.ErrNotFound)
			refused[i] = true
			continue
		}
		if err := ownerStateCanSpawn(st, o.Token); err != nil {
			res.Results[i].Err = errorf("spawn under", o.TaskID, err)
			refused[i] = true
		}
		res.Results[i].Children = make([]Task, len(params[i]))
	}
	var toInsert []store.InsertParams
	var at []child
	for _, c := range children {
		if refused[c.out] || res.Results[c.out].Err != nil {
			continue
		}
		if t, ok := byKey[[2]string{c.p.ConversationID, c.p.IdempotencyKey}]; ok {
			if t.Kind != c.p.Kind || t.OwnerID != c.p.OwnerID {
				res.Results[c.out].Err = errorf("spawn under", c.p.OwnerID, fmt.Errorf("key %q is task %d (kind %q, owner %d): %w",
					c.p.IdempotencyKey, t.ID, t.Kind, t.OwnerID, arbortype.ErrIdempotencyConflict))
				continue
			}
			res.Results[c.out].Children[c.at] = t
			continue
		}
		toInsert = append(toInsert, c.p)
		at = append(at, c)
	}
	// A spawn refused by a key conflict in its last child must not keep its
	// first children: drop the inserts of spawns refused after the fact.
	var keep []store.InsertParams
	var keepAt []child
	for j, c := range at {
		if res.Results[c.out].Err == nil {
			keep, keepAt = append(keep, toInsert[j]), append(keepAt, c)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	ins, err := e.Store.InsertTasks(ctx, tx, keep)
	if err != nil {
		return fmt.Errorf("flush: spawn: %w", mapDBError(err))
	}
	if len(ins) != len(keep) {
		return fmt.Errorf("flush: spawn: %d inserted of %d: %w", len(ins), len(keep), arbortype.ErrDatabase)
	}
	for j, c := range keepAt {
		res.Results[c.out].Children[c.at] = freshTask(c.p, ins[j])
	}
	return nil
}

// flushWaits parks the waits whose children need nothing aborted, and wakes
// at once those already satisfied, in a few statements; it returns the
// waits that go the one-by-one path (a fail_fast wait tripped with live
// siblings to abort).
func (e *Engine) flushWaits(ctx context.Context, tx pgx.Tx, outs []Outcome, idx []int, res *FlushResult) ([]int, error) {
	if len(idx) == 0 {
		return nil, nil
	}
	ids := make([]int64, 0, len(idx))
	var allChildren []int64
	childIDs := map[int][]int64{}
	for _, i := range idx {
		o := outs[i]
		w := o.Wait
		if !w.Policy.Valid() {
			res.Results[i].Err = errorf("wait", o.TaskID, fmt.Errorf("policy %q: %w", w.Policy, arbortype.ErrInvalidArgument))
			continue
		}
		if err := checkText("phase", w.Phase, false); err != nil {
			res.Results[i].Err = errorf("wait", o.TaskID, err)
			continue
		}
		if err := e.checkJSON("state", w.State); err != nil {
			res.Results[i].Err = errorf("wait", o.TaskID, err)
			continue
		}
		cs := slices.Clone(w.ChildIDs)
		slices.Sort(cs)
		cs = slices.Compact(cs)
		if len(cs) > 10_000 {
			res.Results[i].Err = errorf("wait", o.TaskID, fmt.Errorf("%d children, over the limit of 10000: %w", len(cs), arbortype.ErrInvalidArgument))
			continue
		}
		childIDs[i] = cs
		ids = append(ids, o.TaskID)
		allChildren = append(allChildren, cs...)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	states, err := e.Store.LockRunStates(ctx, tx, ids)
	if err != nil {
		return nil, fmt.Errorf("flush: wait: %w", err)
	}
	byID := make(map[int64]store.OwnerState, len(states))
	for _, s := range states {
		byID[s.ID] = s
	}
	kids, err := e.Store.ChildStates(ctx, tx, allChildren)
	if err != nil {
		return nil, fmt.Errorf("flush: wait: %w", err)
	}
	kidByID := make(map[int64]store.ChildState, len(kids))
	for _, k := range kids {
		kidByID[k.ID] = k
	}
	var slow []int
	var park []store.WaitParked
	var wake []int64
	for _, i := range idx {
		cs, ok := childIDs[i]
		if !ok {
			continue
		}
		o := outs[i]
		st, ok := byID[o.TaskID]
		if !ok {
			res.Results[i].Err = errorf("wait", o.TaskID, arbortype.ErrNotFound)
			continue
		}
		if err := checkHolder(Task{ID: st.ID, Status: st.Status, AbortRequested: st.AbortRequested, Token: st.Token}, o.Token); err != nil {
			res.Results[i].Err = errorf("wait", o.TaskID, err)
			continue
		}
		live, tripped, notChild := 0, false, int64(0)
		for _, c := range cs {
			k, ok := kidByID[c]
			if !ok || k.OwnerID != o.TaskID {
				notChild = c
				break
			}
			switch {
			case k.Status.Live():
				live++
			case o.Wait.Policy == FailFast && k.Status != arbortype.StatusCompleted:
				tripped = true
			}
		}
		if notChild != 0 {
			res.Results[i].Err = errorf("wait", o.TaskID, fmt.Errorf("task %d: %w", notChild, arbortype.ErrNotChild))
			continue
		}
		if tripped && live > 0 {
			slow = append(slow, i) // its live siblings are aborted: WaitForChildren does it
			continue
		}
		park = append(park, store.WaitParked{ID: o.TaskID, Phase: o.Wait.Phase, State: o.Wait.State, Policy: o.Wait.Policy, IDs: cs})
		if live == 0 || tripped {
			wake = append(wake, o.TaskID)
			res.Results[i].Woken = true
		}
	}
	if len(park) > 0 {
		to, err := fsm.Transition(arbortype.StatusRunning, fsm.Wait)
		if err != nil {
			return nil, err
		}
		if err := e.Store.WaitMany(ctx, tx, park, to); err != nil {
			return nil, fmt.Errorf("flush: wait: %w", mapDBError(err))
		}
	}
	if len(wake) > 0 {
		to, err := fsm.Transition(arbortype.StatusWaiting, fsm.Wake)
		if err != nil {
			return nil, err
		}
		if err := e.Store.WakeMany(ctx, tx, wake, to); err != nil {
			return nil, fmt.Errorf("flush: wait: %w", mapDBError(err))
		}
	}
	return slow, nil
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
