package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// The completer's flush (flush.go): its spawns.

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
	ins, err := e.Store.InsertTasks(ctx, tx, keep, nil, 0)
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
