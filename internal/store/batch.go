package store

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Set-based statements: one statement for many tasks or conversations, so
// that a batch of operations costs a handful of round trips, not a handful
// per task.

var (
	qEnsureLockConversations = define("EnsureLockConversations")
	qLockConversations       = define("LockConversations")
	qTasksByKeys             = define("TasksByKeys")
	qLockOwners              = define("LockOwners")
	qInsertTasks             = define("InsertTasks")
)

// EnsureLockConversations creates the conversations among ids (sorted,
// distinct) that do not exist, each of the tenant at its index in tenants,
// and locks, in id order, those that do, and announces each at commit; it
// returns the tenant of each conversation it created or locked, all of ids
// unless a conversation is missing.
func (s *Store) EnsureLockConversations(ctx context.Context, db DB, ids, tenants []string) (map[string]string, error) {
	got, _, err := s.EnsureTakeConversations(ctx, db, ids, tenants, 0, nil, nil)
	return got, err
}

// EnsureTakeConversations is EnsureLockConversations that also takes, for
// holder, the new conversations marked in take whose first task (of the
// kind at the same index) a create may start (docs/design.md §3.18): it
// returns the tenants, and the conversations it took.
func (s *Store) EnsureTakeConversations(ctx context.Context, db DB, ids, tenants []string, holder int64, take []bool, kinds []string) (map[string]string, map[string]bool, error) {
	if take == nil {
		take, kinds = make([]bool, len(ids)), make([]string, len(ids))
	}
	rows, err := db.Query(ctx, s.sql[qEnsureLockConversations], ids, s.ChangeChannel(), tenants, holder, take, kinds)
	if err != nil {
		return nil, nil, err
	}
	got, taken := map[string]string{}, map[string]bool{}
	var (
		id, tenant string
		notified   any
		took       bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &tenant, &notified, &took}, func() error {
		got[id] = tenant
		if took {
			taken[id] = true
		}
		return nil
	}); err != nil || len(got) == len(ids) {
		return got, taken, err
	}
	// Created by a transaction that committed after the statement's
	// snapshot: a new statement sees them.
	var missing []string
	for _, id := range ids {
		if _, ok := got[id]; !ok {
			missing = append(missing, id)
		}
	}
	more, err := s.LockConversations(ctx, db, missing)
	for id, t := range more {
		got[id] = t
	}
	return got, taken, err
}

// LockConversations locks the conversations among ids in id order and
// returns the tenant of each it locked (missing ones are left out).
func (s *Store) LockConversations(ctx context.Context, db DB, ids []string) (map[string]string, error) {
	return collectTenants(db.Query(ctx, s.sql[qLockConversations], ids, s.ChangeChannel()))
}

// collectTenants reads rows of (id, tenant, notified).
func collectTenants(rows pgx.Rows, err error) (map[string]string, error) {
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var (
		id, tenant string
		notified   any
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &tenant, &notified}, func() error {
		out[id] = tenant
		return nil
	})
	return out, err
}

// TasksByKeys reads the tasks created with the given (conversation,
// idempotency key) pairs, same index in convs and keys.
func (s *Store) TasksByKeys(ctx context.Context, db DB, convs, keys []string) ([]arbortype.Task, error) {
	return collectTasks(db.Query(ctx, s.sql[qTasksByKeys], convs, keys))
}

// OwnerState is what a create needs to know of an owner it locked.
type OwnerState struct {
	ID             int64
	ConversationID string
	Status         arbortype.Status
	AbortRequested bool
	Token          int64
}

// LockOwners locks the tasks among ids in id order and returns what a
// create checks of them.
func (s *Store) LockOwners(ctx context.Context, db DB, ids []int64) ([]OwnerState, error) {
	rows, err := db.Query(ctx, s.sql[qLockOwners], ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OwnerState, error) {
		var (
			o      OwnerState
			status string
		)
		err := row.Scan(&o.ID, &o.ConversationID, &status, &o.AbortRequested, &o.Token)
		o.Status = arbortype.Status(status)
		return o, err
	})
}

// Inserted is a task InsertTasks created: its id and creation time, the
// rest being what it was inserted with.
type Inserted struct {
	ID        int64
	CreatedAt time.Time
	// Token, Epoch and LeaseExpiresAt are a started task's run (0 and nil
	// for a pending one).
	Token, Epoch   int64
	LeaseExpiresAt *time.Time
}

// InsertTasks creates pending tasks in one statement, in the order given,
// and returns their ids and creation times in that order (ids grow in it).
//
// started, when not nil, marks the tasks to insert running, started by their
// create (docs/design.md §3.18), with a task lease of lease: each the first
// task of a conversation the same transaction took.
func (s *Store) InsertTasks(ctx context.Context, db DB, ps []InsertParams, started []bool, lease time.Duration) ([]Inserted, error) {
	n := len(ps)
	var (
		convs  = make([]string, n)
		owners = make([]int64, n)
		kinds  = make([]string, n)
		bgs    = make([]bool, n)
		inputs = make([]*string, n)
		rls    = make([]int32, n)
		abs    = make([]bool, n)
		mrs    = make([]int32, n)
		keys   = make([]string, n)
		bases  = make([]int64, n)
		caps   = make([]int64, n)
		dls    = make([]*time.Time, n)
		traces = make([]*string, n)
		prios  = make([]int32, n)
		ttls   = make([]int64, n)
		ckeys  = make([]string, n)
		tenant = make([]string, n)
	)
	for i, p := range ps {
		convs[i], owners[i], kinds[i], bgs[i] = p.ConversationID, p.OwnerID, p.Kind, p.Background
		if len(p.Input) > 0 {
			in := string(p.Input)
			inputs[i] = &in
		}
		rls[i], abs[i], mrs[i], keys[i] = int32(p.RestartLimit), p.AbandonOnRestart, int32(p.MaxRetries), p.IdempotencyKey
		bases[i], caps[i], dls[i] = micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline
		prios[i], ttls[i], ckeys[i], tenant[i] = int32(p.Priority), micros(p.QueueTTL), p.ConcurrencyKey, p.Tenant
		if len(p.Trace) > 0 {
			tr := string(p.Trace)
			traces[i] = &tr
		}
	}
	if started == nil {
		started = make([]bool, n)
	}
	rows, err := db.Query(ctx, s.sql[qInsertTasks], convs, owners, kinds, bgs, inputs, rls, abs, mrs, keys, bases, caps, dls, traces, prios, ttls, ckeys, tenant,
		started, micros(lease))
	if err != nil {
		return nil, err
	}
	out, err := pgx.AppendRows(make([]Inserted, 0, n), rows, func(row pgx.CollectableRow) (Inserted, error) {
		var in Inserted
		err := row.Scan(&in.ID, &in.CreatedAt, &in.Token, &in.Epoch, &in.LeaseExpiresAt)
		return in, err
	})
	if err != nil {
		return nil, err
	}
	// Identity values are drawn in the order the rows are inserted, which is
	// the order given: sorted, they are the input's order whatever order
	// RETURNING emitted them in.
	slices.SortFunc(out, func(a, b Inserted) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
