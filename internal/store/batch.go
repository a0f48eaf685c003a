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
	// The conversations of a batch created (those that do not exist) and
	// locked (those that do), each announced at commit, in one statement.
	// A row this transaction inserts needs no lock: no other transaction
	// can see it, nor insert its id, before this one ends; locking it
	// would cost a WAL record per new conversation. An existing row is
	// locked in id order. A conversation another transaction created
	// after this statement's snapshot is neither (the insert skips it,
	// the lock cannot see it): EnsureLockConversations locks those in a
	// statement of their own.
	qEnsureLockConversations = define(`WITH ins AS (
			INSERT INTO {schema}.conversations (id) SELECT unnest($1::text[]) ON CONFLICT (id) DO NOTHING RETURNING id),
		locked AS (
			SELECT c.id FROM {schema}.conversations c
			WHERE c.id = ANY($1) AND NOT c.id = ANY(ARRAY(SELECT id FROM ins))
			ORDER BY c.id FOR NO KEY UPDATE)
		SELECT id, pg_notify($2, id) FROM (SELECT id FROM ins UNION ALL SELECT id FROM locked) x`)

	// Conversations locked in id order (docs/design.md §5), each announced
	// at commit like LockConversation does.
	qLockConversations = define(`SELECT id, pg_notify($2, id) FROM {schema}.conversations
		WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`)

	qTasksByKeys = define(`SELECT {task_columns} FROM {schema}.tasks t
		JOIN unnest($1::text[], $2::text[]) AS k(conv, key) ON t.conversation_id = k.conv AND t.idempotency_key = k.key`)

	qLockOwners = define(`SELECT id, conversation_id, status, abort_requested, coalesce(token, 0)
		FROM {schema}.tasks WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`)

	// The ids are given in the order of the rows (the identity's default
	// is computed as the ordered rows are inserted), so that reading the
	// written rows back by id gives them in the order asked.
	qInsertTasks = define(logged(`INSERT INTO {schema}.tasks AS t
		(conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
		 max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace)
		SELECT v.conv, nullif(v.owner, 0), v.kind, v.bg, v.input::jsonb, v.rl, v.ab, v.mr, nullif(v.key, ''),
		       v.base * interval '1 microsecond', v.cap * interval '1 microsecond', v.deadline, v.trace::jsonb
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bool[], $5::text[], $6::int[], $7::bool[],
		            $8::int[], $9::text[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::text[])
		     WITH ORDINALITY AS v(conv, owner, kind, bg, input, rl, ab, mr, key, base, cap, deadline, trace, ord)
		ORDER BY v.ord`, "t", "id, created_at", "ORDER BY id"))
)

// EnsureLockConversations creates the conversations among ids (sorted,
// distinct) that do not exist and locks, in id order, those that do, and
// announces each at commit; it returns the ids it created or locked, all
// of ids unless a conversation is missing.
func (s *Store) EnsureLockConversations(ctx context.Context, db DB, ids []string) ([]string, error) {
	rows, err := db.Query(ctx, s.sql[qEnsureLockConversations], ids, s.ChangeChannel())
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var (
			id       string
			notified any
		)
		err := row.Scan(&id, &notified)
		return id, err
	})
	if err != nil || len(got) == len(ids) {
		return got, err
	}
	// Created by a transaction that committed after the statement's
	// snapshot: a new statement sees them.
	seen := make(map[string]bool, len(got))
	for _, id := range got {
		seen[id] = true
	}
	var missing []string
	for _, id := range ids {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	more, err := s.LockConversations(ctx, db, missing)
	return append(got, more...), err
}

// LockConversations locks the conversations among ids in id order and
// returns the ids it locked (missing ones are left out).
func (s *Store) LockConversations(ctx context.Context, db DB, ids []string) ([]string, error) {
	rows, err := db.Query(ctx, s.sql[qLockConversations], ids, s.ChangeChannel())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var (
			id       string
			notified any
		)
		err := row.Scan(&id, &notified)
		return id, err
	})
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
}

// InsertTasks creates pending tasks in one statement, in the order given,
// and returns their ids and creation times in that order (ids grow in it).
func (s *Store) InsertTasks(ctx context.Context, db DB, ps []InsertParams) ([]Inserted, error) {
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
	)
	for i, p := range ps {
		convs[i], owners[i], kinds[i], bgs[i] = p.ConversationID, p.OwnerID, p.Kind, p.Background
		if len(p.Input) > 0 {
			in := string(p.Input)
			inputs[i] = &in
		}
		rls[i], abs[i], mrs[i], keys[i] = int32(p.RestartLimit), p.AbandonOnRestart, int32(p.MaxRetries), p.IdempotencyKey
		bases[i], caps[i], dls[i] = micros(p.RetryBackoffBase), micros(p.RetryBackoffCap), p.Deadline
		if len(p.Trace) > 0 {
			tr := string(p.Trace)
			traces[i] = &tr
		}
	}
	rows, err := db.Query(ctx, s.sql[qInsertTasks], convs, owners, kinds, bgs, inputs, rls, abs, mrs, keys, bases, caps, dls, traces)
	if err != nil {
		return nil, err
	}
	out, err := pgx.AppendRows(make([]Inserted, 0, n), rows, func(row pgx.CollectableRow) (Inserted, error) {
		var in Inserted
		err := row.Scan(&in.ID, &in.CreatedAt)
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
