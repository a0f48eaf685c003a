package store

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// A node's claims: set-based, over every conversation of a batch (node.go).

var (
	qClaimIn   = define("ClaimIn")
	qClaimHeld = define("ClaimHeld")
)

// ClaimIn starts up to limit pending tasks of the conversations convs that
// holder holds, of kinds (nil: any), by the generation rule for generation
// kinds gen (nil: every root is a generation), oldest first, each with its
// own token and the conversation's epoch. It returns the runs' rows (the
// run columns), in no particular order, and the transaction's id (0 when
// it claimed nothing).
func (s *Store) ClaimIn(ctx context.Context, db DB, holder int64, convs, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration, busy Busy) ([]arbortype.Task, int64, error) {
	if convs == nil {
		convs = []string{}
	}
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimIn], holder, convs, kinds, gen, limit, string(status), micros(lease), busy.Tenants, busy.Runs))
}

// ClaimHeld is ClaimIn across every conversation holder holds.
func (s *Store) ClaimHeld(ctx context.Context, db DB, holder int64, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration, busy Busy) ([]arbortype.Task, int64, error) {
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimHeld], holder, nil, kinds, gen, limit, string(status), micros(lease), busy.Tenants, busy.Runs))
}
