package core

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/store"
)

// MaxTenantWeight bounds a tenant's weight in the fair claim.
const MaxTenantWeight = 1000

// SetTenantWeight sets the weight of tenant in the fair claim (1 to
// MaxTenantWeight), in one statement.
func SetTenantWeight(ctx context.Context, e *Engine, tenant string, weight int) error {
	if err := checkText("tenant", tenant, false); err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	if weight < 1 || weight > MaxTenantWeight {
		return fmt.Errorf("set tenant weight: %d is outside 1..%d: %w", weight, MaxTenantWeight, arbortype.ErrInvalidArgument)
	}
	_, err := Write(ctx, e, func(db store.DB) (struct{}, error) {
		return struct{}{}, e.Store.SetTenantWeight(ctx, db, tenant, weight)
	})
	if err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	return nil
}

// limitKinds are the prefixes of a concurrency limit's key.
var limitKinds = []string{"tenant:", "kind:", "key:"}

// CheckLimitKey refuses a concurrency limit's key that is not
// "tenant:<tenant>", "kind:<kind>" or "key:<key>", the name within at most
// 200 bytes of text (a kind or a key not empty).
func CheckLimitKey(key string) error {
	for _, p := range limitKinds {
		if name, ok := strings.CutPrefix(key, p); ok {
			return checkText("concurrency limit key "+p, name, p != "tenant:")
		}
	}
	return fmt.Errorf("concurrency limit key %q: not tenant:<tenant>, kind:<kind> or key:<key>: %w", key, arbortype.ErrInvalidArgument)
}

// SetConcurrencyLimit sets limit key to max (0 or more). A new limit counts
// the runs of its key already under way: it is created in one transaction,
// and they are named in it in a second, under its lock (design.md §3.15).
func SetConcurrencyLimit(ctx context.Context, e *Engine, key string, max int) error {
	if err := CheckLimitKey(key); err != nil {
		return fmt.Errorf("set concurrency limit: %w", err)
	}
	if max < 0 || max > maxInt32 {
		return fmt.Errorf("set concurrency limit: %d is outside 0..%d: %w", max, maxInt32, arbortype.ErrInvalidArgument)
	}
	created, err := Write(ctx, e, func(db store.DB) (bool, error) { return e.Store.SetLimit(ctx, db, key, max) })
	if err != nil {
		return fmt.Errorf("set concurrency limit: %w", err)
	}
	if !created {
		return nil
	}
	if _, err := Tx(ctx, e, func(tx pgx.Tx) (bool, error) { return e.Store.AdoptRuns(ctx, tx, key) }); err != nil {
		return fmt.Errorf("set concurrency limit: counting the runs under way: %w", err)
	}
	return nil
}

// DeleteConcurrencyLimit removes limit key; ErrNotFound when there is none.
func DeleteConcurrencyLimit(ctx context.Context, e *Engine, key string) error {
	if err := CheckLimitKey(key); err != nil {
		return fmt.Errorf("delete concurrency limit: %w", err)
	}
	ok, err := Write(ctx, e, func(db store.DB) (bool, error) { return e.Store.DeleteLimit(ctx, db, key) })
	switch {
	case err != nil:
		return fmt.Errorf("delete concurrency limit: %w", err)
	case !ok:
		return fmt.Errorf("delete concurrency limit %q: %w", key, arbortype.ErrNotFound)
	}
	return nil
}

// ExpireQueued cancels, with code CodeExpired, up to limit pending tasks
// that never started and whose time to live in the queue passed, each in a
// transaction of its own (its conversation locked first, so that a claim
// cannot start it meanwhile: a claim filters them out with the same test).
// It returns how many it cancelled.
func (e *Engine) ExpireQueued(ctx context.Context, limit int) (int, error) {
	ids, err := Read(ctx, e, func(db store.DB) ([]int64, error) { return e.Store.ExpiredInQueue(ctx, db, limit) })
	if err != nil {
		return 0, fmt.Errorf("expire queued tasks: %w", err)
	}
	n := 0
	for _, id := range ids {
		done, err := Tx(ctx, e, func(tx pgx.Tx) (bool, error) {
			t, err := e.lockConversationOf(ctx, tx, id)
			if err != nil {
				return false, err
			}
			// Expired when it was listed, by the database's clock (as the
			// claims judge it): still so, unless it started or settled.
			if t.Status != arbortype.StatusPending || t.StartedAt != nil || t.QueueExpiresAt == nil {
				return false, nil
			}
			_, err = e.settle(ctx, tx, t, fsm.Cancel, nil, &TaskError{Code: arbortype.CodeExpired,
				Message: fmt.Sprintf("not started by %s, the end of its time to live in the queue", t.QueueExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z"))})
			return err == nil, err
		})
		if err != nil {
			return n, fmt.Errorf("expire queued task %d: %w", id, err)
		}
		if done {
			n++
		}
	}
	return n, nil
}
