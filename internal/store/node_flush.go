package store

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// The completer's flush: the set-based statements that apply a batch of
// runs' outcomes at once (internal/core's flush.go).

var (
	qLockForFlush  = define("LockForFlush")
	qCompleteMany  = define("CompleteMany")
	qWakeSatisfied = define("WakeSatisfied")
	qCompleteHeld  = define("CompleteHeld")
	qLockRunStates = define("LockRunStates")
	qChildStates   = define("ChildStates")
	qWaitMany      = define("WaitMany")
	qWakeMany      = define("WakeMany")
)

// LockForFlush locks the conversations in id order, skipping those another
// transaction holds (missing from held), and says which holder row holder
// still holds; xact is the transaction's id (0 when it locked none).
func (s *Store) LockForFlush(ctx context.Context, db DB, ids []string, holder int64) (held map[string]bool, xact int64, err error) {
	rows, err := db.Query(ctx, s.sql[qLockForFlush], ids, holder)
	if err != nil {
		return nil, 0, err
	}
	held = make(map[string]bool, len(ids))
	var (
		id string
		h  bool
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &h, &xact}, func() error {
		held[id] = h
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return held, xact, nil
}

// Settled is a task a set-based statement settled: its id and its owner's.
type Settled struct {
	ID, OwnerID int64
}

func collectSettled(rows pgx.Rows, err error) ([]Settled, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Settled, error) {
		var s Settled
		err := row.Scan(&s.ID, &s.OwnerID)
		return s, err
	})
}

// CompleteMany settles as `to` (completed) the running tasks among ids held
// with the token at the same index, not being aborted and with no live
// foreground child, recording the result at the same index; it returns
// those it settled.
func (s *Store) CompleteMany(ctx context.Context, db DB, ids, tokens []int64, results []*string, to arbortype.Status) ([]Settled, error) {
	rows, err := db.Query(ctx, s.sql[qCompleteMany], ids, tokens, results, string(to))
	return collectSettled(rows, err)
}

// WakeSatisfied wakes (`to`, pending) the waiting tasks among ids whose
// waited children are all settled, and returns them.
func (s *Store) WakeSatisfied(ctx context.Context, db DB, ids []int64, to arbortype.Status) ([]int64, error) {
	return collect[int64](db.Query(ctx, s.sql[qWakeSatisfied], ids, string(to)))
}

// CompleteHeld completes (`to`) the completing tasks among ids with no live
// foreground child, and returns them.
func (s *Store) CompleteHeld(ctx context.Context, db DB, ids []int64, to arbortype.Status) ([]Settled, error) {
	rows, err := db.Query(ctx, s.sql[qCompleteHeld], ids, string(to))
	return collectSettled(rows, err)
}

// LockRunStates locks the tasks among ids in id order and reads what a
// fenced write checks of them.
func (s *Store) LockRunStates(ctx context.Context, db DB, ids []int64) ([]OwnerState, error) {
	rows, err := db.Query(ctx, s.sql[qLockRunStates], ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OwnerState, error) {
		var (
			o  OwnerState
			st string
		)
		err := row.Scan(&o.ID, &st, &o.Token, &o.AbortRequested)
		o.Status = arbortype.Status(st)
		return o, err
	})
}

// ChildState is what a wait checks of a waited child.
type ChildState struct {
	ID, OwnerID int64
	Status      arbortype.Status
	SettleSeq   int64
}

// ChildStates reads the tasks among ids (missing ones are left out).
func (s *Store) ChildStates(ctx context.Context, db DB, ids []int64) ([]ChildState, error) {
	rows, err := db.Query(ctx, s.sql[qChildStates], ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChildState, error) {
		var (
			c  ChildState
			st string
		)
		err := row.Scan(&c.ID, &c.OwnerID, &st, &c.SettleSeq)
		c.Status = arbortype.Status(st)
		return c, err
	})
}

// WaitParked is one wait WaitMany parks.
type WaitParked struct {
	ID     int64
	Phase  string
	State  json.RawMessage
	Policy arbortype.WaitPolicy
	IDs    []int64
}

// WaitMany parks running tasks on their children (`to`, waiting) in one
// statement; the caller has locked and checked them.
func (s *Store) WaitMany(ctx context.Context, db DB, ws []WaitParked, to arbortype.Status) error {
	n := len(ws)
	ids, phases, states, policies, lists := make([]int64, n), make([]string, n), make([]*string, n), make([]string, n), make([]string, n)
	for i, w := range ws {
		ids[i], phases[i], policies[i] = w.ID, w.Phase, string(w.Policy)
		if len(w.State) > 0 {
			st := string(w.State)
			states[i] = &st
		}
		lists[i] = int64Array(w.IDs)
	}
	_, err := db.Exec(ctx, s.sql[qWaitMany], ids, phases, states, policies, lists, string(to))
	return err
}

// WakeMany moves the tasks among ids (waiting, just parked) to `to`
// (pending).
func (s *Store) WakeMany(ctx context.Context, db DB, ids []int64, to arbortype.Status) error {
	_, err := db.Exec(ctx, s.sql[qWakeMany], ids, string(to))
	return err
}

// int64Array writes ids as a PostgreSQL array literal.
func int64Array(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, '}'))
}
