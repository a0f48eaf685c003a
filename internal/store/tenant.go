package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

var (
	qSetTenantWeight = define("SetTenantWeight")
	qTenants         = define("Tenants")
	qSetLimit        = define("SetLimit")
	qLockLimit       = define("LockLimit")
	qAdoptRuns       = define("AdoptRuns")
	qCountSlots      = define("CountSlots")
	qDeleteLimit     = define("DeleteLimit")
	qLimits          = define("Limits")
	qExpiredInQueue  = define("ExpiredInQueue")
	qSlotCounts      = define("SlotCounts")
)

// SlotCount is a concurrency limit's running count beside the runs whose
// slots name it.
type SlotCount struct {
	Key           string
	Running, Runs int
}

// SlotCounts reads every limit's running count and the runs naming it, in
// one snapshot.
func (s *Store) SlotCounts(ctx context.Context, db DB) ([]SlotCount, error) {
	rows, err := db.Query(ctx, s.sql[qSlotCounts])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[SlotCount])
}

// SetTenantWeight sets the weight of tenant in the fair claim.
func (s *Store) SetTenantWeight(ctx context.Context, db DB, tenant string, weight int) error {
	_, err := db.Exec(ctx, s.sql[qSetTenantWeight], tenant, weight)
	return err
}

// Tenants lists the tenants given a weight, by name.
func (s *Store) Tenants(ctx context.Context, db DB) ([]arbortype.Tenant, error) {
	rows, err := db.Query(ctx, s.sql[qTenants])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[arbortype.Tenant])
}

// SetLimit sets concurrency limit key to max and says whether it is new.
func (s *Store) SetLimit(ctx context.Context, db DB, key string, max int) (created bool, err error) {
	err = db.QueryRow(ctx, s.sql[qSetLimit], key, max).Scan(&created)
	return created, err
}

// AdoptRuns locks limit key, names it in the slots of the running tasks of
// its key, and counts them; false when the limit does not exist (deleted
// meanwhile).
func (s *Store) AdoptRuns(ctx context.Context, tx pgx.Tx, key string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, s.sql[qLockLimit], key).Scan(&ok)
	if IsNoRows(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, s.sql[qAdoptRuns], key); err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, s.sql[qCountSlots], key)
	return err == nil, err
}

// DeleteLimit removes limit key and says whether it existed.
func (s *Store) DeleteLimit(ctx context.Context, db DB, key string) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qDeleteLimit], key)
	return tag.RowsAffected() > 0, err
}

// Limits lists the concurrency limits by key.
func (s *Store) Limits(ctx context.Context, db DB) ([]arbortype.ConcurrencyLimit, error) {
	rows, err := db.Query(ctx, s.sql[qLimits])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[arbortype.ConcurrencyLimit])
}

// ExpiredInQueue lists up to limit pending tasks that never started and
// whose time to live in the queue passed.
func (s *Store) ExpiredInQueue(ctx context.Context, db DB, limit int) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql[qExpiredInQueue], limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
