package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// The completer's flush (flush.go): its waits.

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
