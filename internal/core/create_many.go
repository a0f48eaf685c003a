package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// maxBatch bounds the tasks one CreateMany (or one flush) takes.
const maxBatch = 10_000

// CreateMany creates many tasks in one transaction and a handful of
// statements, whatever their number: the conversations are created and
// locked in one statement each (in id order), the idempotency keys looked
// up in one, the owners locked and checked in one, and the new tasks
// inserted in one. The rules are Create's, task by task: a key already used
// in the conversation returns that task (created false; a key repeated
// within the batch too), an owner must exist beforehand (not in the same
// batch), be live, in the same conversation, not completing nor being
// aborted, and hold ownerToken when one is given. One refused task refuses
// the whole batch, with the index of the first refused one in the error,
// and nothing is written.
//
// Tasks come back in the order of ps.
func (e *Engine) CreateMany(ctx context.Context, tx pgx.Tx, ps []CreateParams) ([]Task, []bool, error) {
	return e.CreateManyStarting(ctx, tx, ps, Start{})
}

// CreateManyStarting is CreateMany that starts, as their create, up to
// st.N of the tasks (docs/design.md §3.18): the first task of each of the
// first st.N new conversations whose first task a create may start (a
// root of a kind st.Runs, startable), in the order given, each
// conversation taken by st.Holder at epoch 1. Started tasks come back
// running.
func (e *Engine) CreateManyStarting(ctx context.Context, tx pgx.Tx, ps []CreateParams, st Start) ([]Task, []bool, error) {
	if len(ps) == 0 {
		return nil, nil, nil
	}
	if len(ps) > maxBatch {
		return nil, nil, fmt.Errorf("create tasks: %d, over the limit of %d: %w", len(ps), maxBatch, arbortype.ErrInvalidArgument)
	}
	params := make([]store.InsertParams, len(ps))
	convSet := map[string]bool{}
	convTenant := map[string]string{} // the tenant a create names for its conversation
	var owners []int64
	for i, p := range ps {
		ip, err := e.createParams(p)
		if err != nil {
			return nil, nil, fmt.Errorf("create tasks: task %d of %d: %w", i, len(ps), err)
		}
		params[i] = ip
		convSet[p.ConversationID] = true
		if p.Tenant != "" {
			if t, ok := convTenant[p.ConversationID]; ok && t != p.Tenant {
				return nil, nil, fmt.Errorf("create tasks: task %d of %d: conversation %q named with tenants %q and %q: %w",
					i, len(ps), p.ConversationID, t, p.Tenant, arbortype.ErrInvalidArgument)
			}
			convTenant[p.ConversationID] = p.Tenant
		}
		if p.OwnerID != 0 && !slices.Contains(owners, p.OwnerID) {
			owners = append(owners, p.OwnerID)
		}
	}
	convs := make([]string, 0, len(convSet))
	for c := range convSet {
		convs = append(convs, c)
	}
	slices.Sort(convs)

	// Owners first, unlocked (their conversation never changes): a foreign
	// or unknown one is refused before anything is written.
	if len(owners) > 0 {
		found, err := e.Store.GetTasks(ctx, tx, owners)
		if err != nil {
			return nil, nil, fmt.Errorf("create tasks: %w", err)
		}
		if err := checkOwners(ps, found); err != nil {
			return nil, nil, err
		}
	}
	tenants := make([]string, len(convs))
	for i, c := range convs {
		tenants[i] = convTenant[c]
	}
	// The conversations a create may take: those whose first task in the
	// batch it may start, the first st.N of them.
	var take []bool
	var takeKinds []string
	first := map[string]int{} // a conversation's first task in ps
	if st.N > 0 {
		for i, p := range ps {
			if _, seen := first[p.ConversationID]; !seen {
				first[p.ConversationID] = i
			}
		}
		take, takeKinds = make([]bool, len(convs)), make([]string, len(convs))
		n := 0
		for j, c := range convs {
			p := ps[first[c]]
			if n < st.N && startable(p) && st.Runs(p.Kind) {
				take[j], takeKinds[j] = true, p.Kind
				n++
			}
		}
	}
	has, taken, err := e.Store.EnsureTakeConversations(ctx, tx, convs, tenants, st.Holder, take, takeKinds)
	if err != nil {
		return nil, nil, fmt.Errorf("create tasks: %w", mapDBError(err))
	}
	for i, p := range ps {
		if err := checkTenant(p.ConversationID, has[p.ConversationID], p.Tenant); err != nil {
			return nil, nil, fmt.Errorf("create tasks: task %d of %d: %w", i, len(ps), err)
		}
		params[i].Tenant = has[p.ConversationID]
	}

	out := make([]Task, len(ps))
	created := make([]bool, len(ps))
	done := make([]bool, len(ps))
	// Idempotency keys: existing tasks, and repeats within the batch.
	var keyConvs, keys []string
	for _, p := range ps {
		if p.IdempotencyKey != "" {
			keyConvs, keys = append(keyConvs, p.ConversationID), append(keys, p.IdempotencyKey)
		}
	}
	if len(keys) > 0 {
		existing, err := e.Store.TasksByKeys(ctx, tx, keyConvs, keys)
		if err != nil {
			return nil, nil, fmt.Errorf("create tasks: %w", err)
		}
		byKey := map[[2]string]Task{}
		for _, t := range existing {
			byKey[[2]string{t.ConversationID, t.IdempotencyKey}] = t
		}
		for i, p := range ps {
			if p.IdempotencyKey == "" {
				continue
			}
			t, ok := byKey[[2]string{p.ConversationID, p.IdempotencyKey}]
			if !ok {
				continue
			}
			if t.Kind != p.Kind || t.OwnerID != p.OwnerID {
				return nil, nil, fmt.Errorf("create tasks: task %d of %d: key %q is task %d (kind %q, owner %d): %w",
					i, len(ps), p.IdempotencyKey, t.ID, t.Kind, t.OwnerID, arbortype.ErrIdempotencyConflict)
			}
			out[i], done[i] = t, true
		}
	}
	// The owners of what is left to create, locked in id order.
	var lockOwners []int64
	for i, p := range ps {
		if !done[i] && p.OwnerID != 0 && !slices.Contains(lockOwners, p.OwnerID) {
			lockOwners = append(lockOwners, p.OwnerID)
		}
	}
	if len(lockOwners) > 0 {
		slices.Sort(lockOwners)
		states, err := e.Store.LockOwners(ctx, tx, lockOwners)
		if err != nil {
			return nil, nil, fmt.Errorf("create tasks: %w", err)
		}
		byID := make(map[int64]store.OwnerState, len(states))
		for _, o := range states {
			byID[o.ID] = o
		}
		for i, p := range ps {
			if done[i] || p.OwnerID == 0 {
				continue
			}
			o := byID[p.OwnerID]
			if err := ownerStateCanSpawn(o, p.OwnerToken); err != nil {
				return nil, nil, fmt.Errorf("create tasks: task %d of %d: %w", i, len(ps), err)
			}
		}
	}
	// Insert the rest; a key repeated within the batch is created once.
	var toInsert []store.InsertParams
	var at []int
	firstOfKey := map[[2]string]int{}
	for i, p := range ps {
		if done[i] {
			continue
		}
		if p.IdempotencyKey != "" {
			k := [2]string{p.ConversationID, p.IdempotencyKey}
			if j, ok := firstOfKey[k]; ok {
				if ps[j].Kind != p.Kind || ps[j].OwnerID != p.OwnerID {
					return nil, nil, fmt.Errorf("create tasks: task %d of %d: key %q is also task %d of the batch, of another kind or owner: %w",
						i, len(ps), p.IdempotencyKey, j, arbortype.ErrIdempotencyConflict)
				}
				continue
			}
			firstOfKey[k] = i
		}
		toInsert = append(toInsert, params[i])
		at = append(at, i)
	}
	if len(toInsert) > 0 {
		var started []bool
		if len(taken) > 0 {
			started = make([]bool, len(toInsert))
			for j, i := range at {
				started[j] = taken[ps[i].ConversationID] && first[ps[i].ConversationID] == i
			}
		}
		ins, err := e.Store.InsertTasks(ctx, tx, toInsert, started, e.startLease())
		if err != nil {
			return nil, nil, fmt.Errorf("create tasks: %w", mapDBError(err))
		}
		if len(ins) != len(toInsert) {
			return nil, nil, fmt.Errorf("create tasks: %d inserted of %d: %w", len(ins), len(toInsert), arbortype.ErrDatabase)
		}
		for j, i := range at {
			out[i], created[i], done[i] = freshTask(params[i], ins[j]), true, true
		}
	}
	// Repeats of a key within the batch get the task its first use made.
	for i, p := range ps {
		if !done[i] {
			out[i] = out[firstOfKey[[2]string{p.ConversationID, p.IdempotencyKey}]]
		}
	}
	return out, created, nil
}

// checkOwners refuses unknown owners and owners of another conversation.
func checkOwners(ps []CreateParams, found []Task) error {
	conv := make(map[int64]string, len(found))
	for _, t := range found {
		conv[t.ID] = t.ConversationID
	}
	for i, p := range ps {
		if p.OwnerID == 0 {
			continue
		}
		c, ok := conv[p.OwnerID]
		switch {
		case !ok:
			return fmt.Errorf("create tasks: task %d of %d: owner %d: %w", i, len(ps), p.OwnerID, arbortype.ErrNotFound)
		case c != p.ConversationID:
			return fmt.Errorf("create tasks: task %d of %d: owner %d is in conversation %q, not %q: %w",
				i, len(ps), p.OwnerID, c, p.ConversationID, arbortype.ErrForeignOwner)
		}
	}
	return nil
}

// ownerStateCanSpawn is ownerCanSpawn (and the token fence of a spawn) on
// a locked owner's state.
func ownerStateCanSpawn(o store.OwnerState, token int64) error {
	switch {
	case o.Status.Settled():
		return fmt.Errorf("owner %d is %s: %w", o.ID, o.Status, arbortype.ErrOwnerNotLive)
	case o.AbortRequested:
		return fmt.Errorf("owner %d: %w", o.ID, arbortype.ErrOwnerAborting)
	case o.Status == arbortype.StatusCompleting:
		return fmt.Errorf("owner %d: %w", o.ID, arbortype.ErrOwnerCompleting)
	}
	if token != 0 {
		return checkHolder(Task{ID: o.ID, Status: o.Status, AbortRequested: o.AbortRequested, Token: o.Token}, token)
	}
	return nil
}

// freshTask is the row a create inserted, built from what it was inserted
// with: the statement returns only what the database chose.
func freshTask(p store.InsertParams, in store.Inserted) Task {
	t := Task{
		ID: in.ID, ConversationID: p.ConversationID, OwnerID: p.OwnerID, Kind: p.Kind,
		Status: arbortype.StatusPending, Background: p.Background, Input: p.Input,
		RestartLimit: p.RestartLimit, AbandonOnRestart: p.AbandonOnRestart, MaxRetries: p.MaxRetries,
		RetryBackoffBase: p.RetryBackoffBase, RetryBackoffCap: p.RetryBackoffCap,
		IdempotencyKey: p.IdempotencyKey, CreatedAt: in.CreatedAt, UpdatedAt: in.CreatedAt, Deadline: p.Deadline,
		ErrorHistory: []arbortype.FailedTry{},
		Tenant:       p.Tenant, Priority: p.Priority, ConcurrencyKey: p.ConcurrencyKey,
	}
	if p.QueueTTL > 0 {
		at := in.CreatedAt.Add(p.QueueTTL.Truncate(time.Microsecond))
		t.QueueExpiresAt = &at
	}
	if in.Token != 0 {
		// Started by its create (docs/design.md §3.18).
		started := in.CreatedAt
		t.Status, t.Token, t.Epoch, t.StartedAt, t.LeaseExpiresAt = arbortype.StatusRunning, in.Token, in.Epoch, &started, in.LeaseExpiresAt
	}
	if len(p.Trace) > 0 {
		// traceJSON encoded it from a map of strings: it decodes.
		_ = json.Unmarshal(p.Trace, &t.Trace)
	}
	return t
}
