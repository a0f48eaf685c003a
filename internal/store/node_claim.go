package store

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// A node's claims: set-based, over every conversation of a batch (node.go).

var (
	// The claims of a node: in the conversations given ($2), or in all it
	// holds. Two stages, so that the plan does not depend on statistics:
	// the candidates are found from the conversations (by the index of
	// each conversation's live tasks, or of the holder's conversations),
	// the generation rule applied, oldest first; then each is locked, with
	// its conversation share-locked as held by $1, both skipping rows
	// another transaction holds, and checked again as locked.
	qClaimIn   = define(claimSQL(`SELECT DISTINCT unnest($2::text[]) AS id`))
	qClaimHeld = define(claimSQL(`SELECT c.id FROM {schema}.conversations c WHERE c.holder_id = $1 AND $2::text[] IS NULL`))
)

// genRule is the generation rule as SQL, for a pending task t: children,
// and roots that are not generations (kinds outside $gen, when $gen is not
// null), start freely; a root that is a generation starts if it is under way
// already (started before: woken or requeued), or if no other live
// generation of its conversation is under way or older. At most one live
// generation of a conversation runs at a time, oldest first.
const genRule = `(t.owner_task_id IS NOT NULL
		OR ($gen::text[] IS NOT NULL AND NOT (t.kind = ANY($gen::text[])))
		OR t.started_at IS NOT NULL
		OR NOT EXISTS (SELECT 1 FROM {schema}.tasks r
			WHERE r.conversation_id = t.conversation_id AND r.owner_task_id IS NULL AND r.id <> t.id
			  AND r.status IN ({live})
			  AND ($gen::text[] IS NULL OR r.kind = ANY($gen::text[]))
			  AND (r.started_at IS NOT NULL OR r.id < t.id)))`

// claimSQL is a node's claim in the conversations convs selects (see
// qClaimIn). Its shape fixes the plan: each conversation's pending tasks
// are read by the index of its live tasks (a lateral subquery, run per
// conversation), and the candidates are then locked by primary key.
//
// The status and holder tests are written so that no other index can
// serve them, whatever the statistics say: statistics over a settled
// history (nothing pending, no conversation held, analyzed between runs)
// planned the lateral as a scan of the whole pending index per
// conversation, and the lock as a scan of every pending task joined to
// every conversation of the holder — pending × held rows per claim (bench
// (l): 415 µs of server CPU per task after 30,000 settled tasks, 2,546
// after 1,000,000, against 88 fresh). "status IN ({live}) AND status IS
// NOT DISTINCT FROM 'pending'" is status = 'pending' (status is never
// NULL) that proves the live index's predicate but not the pending
// index's; IS NOT DISTINCT FROM no index serves, and the holder is never
// NULL on the side of $1. TestClaimKeepsItsPlanAfterASettledHistory
// keeps it so.
//
// A claim is refused by the database once its holder's row has expired
// (the fence on the node's own clock stops it first; this is for the
// claim sent by a process resumed from a freeze before its fence fired,
// whose run the taker would have counted as a restart).
func claimSQL(convs string) string {
	return expand(logged(`WITH cand AS MATERIALIZED (
			SELECT t.id FROM (`+convs+`) cv
			CROSS JOIN LATERAL (
				SELECT t.id FROM {schema}.tasks t
				WHERE t.conversation_id = cv.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
				  AND NOT t.abort_requested
				  AND ($3::text[] IS NULL OR t.kind = ANY($3))
				  AND `+genRule+`
				ORDER BY t.id LIMIT $5) t
			ORDER BY t.id LIMIT $5),
		picked AS (
			SELECT t.id AS picked_id, c.epoch AS picked_epoch FROM {schema}.tasks t
			JOIN {schema}.conversations c ON c.id = t.conversation_id
			WHERE t.id = ANY(ARRAY(SELECT id FROM cand))
			  AND t.status IS NOT DISTINCT FROM 'pending' AND NOT t.abort_requested
			  AND c.holder_id IS NOT DISTINCT FROM $1::bigint
			  AND EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = $1::bigint AND h.expires_at > now())
			FOR NO KEY UPDATE OF t, c SKIP LOCKED)
		UPDATE {schema}.tasks t SET `+claimSet+`
		FROM picked WHERE t.id = picked.picked_id`, "t", "{run_columns}, pg_current_xact_id()::text::bigint", "ORDER BY id"), "$gen", "$4", "$status", "$6", "$epoch", "picked.picked_epoch", "$lease", "$7")
}

// ClaimIn starts up to limit pending tasks of the conversations convs that
// holder holds, of kinds (nil: any), by the generation rule for generation
// kinds gen (nil: every root is a generation), oldest first, each with its
// own token and the conversation's epoch. It returns the runs' rows (the
// run columns), in no particular order, and the transaction's id (0 when
// it claimed nothing).
func (s *Store) ClaimIn(ctx context.Context, db DB, holder int64, convs, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration) ([]arbortype.Task, int64, error) {
	if convs == nil {
		convs = []string{}
	}
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimIn], holder, convs, kinds, gen, limit, string(status), micros(lease)))
}

// ClaimHeld is ClaimIn across every conversation holder holds.
func (s *Store) ClaimHeld(ctx context.Context, db DB, holder int64, kinds, gen []string, limit int, status arbortype.Status, lease time.Duration) ([]arbortype.Task, int64, error) {
	return collectRunTasksXact(db.Query(ctx, s.sql[qClaimHeld], holder, nil, kinds, gen, limit, string(status), micros(lease)))
}
