package store

import (
	"context"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// Holders and conversation leases (docs/design.md §3.8, package machine's
// doc). A holder is one row of the holders table — a life of a runner's
// node, or one machine.Lease — and holds every conversation whose
// holder_id names it while its deadline (expires_at, by the database's
// clock) has not passed. Taking a conversation over bumps its epoch, so
// every fence a former holder writes with fails. Only the holder's own
// renewal locks its row: take-overs read it.

// heldLive says that conversation c's holder is live: its row's deadline
// has not passed. (The alias c is the statement's.)
const heldLive = `EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now())`

// freeToTake says that conversation c has no live holder.
const freeToTake = `(c.holder_id IS NULL OR NOT ` + heldLive + `)`

// notHeldLive says that task t's conversation has no live holder, found
// by primary key: a scalar subquery, not NOT EXISTS, so that a scan of
// pending tasks in id order stays one (see qOpenConversations). The join
// on coalesce(h.holder_id, 0) does not imply holder_id IS NOT NULL, the
// predicate of the partial holder index, so that index cannot serve the
// probe: over statistics that showed it empty, the probe read it whole
// for every task (every conversation the node held), 2.7 s for an open
// in bench (l).
const notHeldLive = `NOT coalesce((SELECT true FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = coalesce(h.holder_id, 0)
	WHERE h.id = t.conversation_id AND hh.expires_at >= now()), false)`

// runsIn says that conversation c has a running task, found through the
// live index by conversation: a scalar subquery, for notHeldLive's reason.
const runsIn = `coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status = 'running' LIMIT 1), false)`

// prevHolder is what a take-over reports of the holder it took c from: its
// id (0: none), and whether its last renewal came before the server's start
// (a database restart lapsed it: the restarts it leaves are not counted) or
// before the server's promotion (a failover did): a promoted standby's
// pg_postmaster_start_time() is its start as a standby, long before, while
// pg_last_xact_replay_timestamp() stays at the last commit it replayed
// before the promotion, which no renewal on the old primary came after.
const prevHolder = `coalesce(c.holder_id, 0) AS prev_holder,
		coalesce((SELECT hp.renewed_at < pg_postmaster_start_time() OR hp.renewed_at <= pg_last_xact_replay_timestamp() FROM {schema}.holders hp WHERE hp.id = c.holder_id), false) AS prev_restarted`

var (
	qNewHolder = define(`INSERT INTO {schema}.holders (name, expires_at)
		VALUES ($1, now() + $2 * interval '1 microsecond') RETURNING id`)

	// A renewal extends a live row only: a row whose deadline passed may
	// have lost conversations to take-overs, and its holder must find out
	// which before it acts again (it starts a new life). It never brings
	// the deadline closer (a shorter ttl, the database's clock stepped
	// back), which the holders' guard refuses: the holder's fence counts
	// from the deadline it was promised.
	qRenewHolder = define(`UPDATE {schema}.holders SET expires_at = greatest(expires_at, now() + $2 * interval '1 microsecond'), renewed_at = now()
		WHERE id = $1 AND expires_at >= now() RETURNING id`)

	// A holder that is done (a stopped runner, a released Lease) removes its
	// row, if it holds nothing any more.
	qEndHolder = define(`DELETE FROM {schema}.holders h WHERE h.id = $1
		AND NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = h.id)`)

	// Lives long over that hold nothing, removed a batch at a time.
	qPruneHolders = define(`DELETE FROM {schema}.holders WHERE id IN (
		SELECT h.id FROM {schema}.holders h
		WHERE h.expires_at < now() - $1 * interval '1 microsecond'
		  AND NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = h.id)
		ORDER BY h.id LIMIT $2)`)

	// SKIP LOCKED: a conversation another holder is taking over right now
	// (or that a transaction is working on) is skipped, not waited for; the
	// caller comes back to it.
	qTakeConversation = define(`WITH picked AS (
			SELECT c.id, ` + prevHolder + ` FROM {schema}.conversations c
			WHERE c.id = $1 AND ` + freeToTake + `
			FOR NO KEY UPDATE OF c SKIP LOCKED)
		UPDATE {schema}.conversations c
		SET holder = $2, holder_id = $3, epoch = c.epoch + 1, updated_at = now()
		FROM picked WHERE c.id = picked.id
		RETURNING ` + conversationColumns + `, picked.prev_holder, picked.prev_restarted`)

	// The release locks the row (the engine requeues the holder's running
	// tasks in the same transaction, see LockHeldConversation) and frees it.
	qLockHeldConversation = define(`SELECT ` + conversationColumns + `, pg_notify($4, c.id) FROM {schema}.conversations c
		WHERE c.id = $1 AND c.holder_id = $2 AND c.epoch = $3 FOR NO KEY UPDATE OF c`)

	// The same, skipping a row another transaction holds (the runner's
	// audit, which must not wait: no row is returned then either).
	qTryLockHeldConversation = define(`SELECT ` + conversationColumns + `, pg_notify($4, c.id) FROM {schema}.conversations c
		WHERE c.id = $1 AND c.holder_id = $2 AND c.epoch = $3 FOR NO KEY UPDATE OF c SKIP LOCKED`)

	qReleaseConversation = define(`UPDATE {schema}.conversations
		SET holder = NULL, holder_id = NULL, updated_at = now()
		WHERE id = $1 AND holder_id = $2 AND epoch = $3`)

	// Locked: a take-over (an UPDATE of the row) waits for the fenced
	// transaction to end, and the fenced transaction, if it comes second,
	// sees the new epoch. Exclusively (FOR NO KEY UPDATE), as every writer
	// of the conversation's log holds it, so that the log's order is its
	// commit order.
	qFenceConversation = define(`SELECT epoch FROM {schema}.conversations
		WHERE id = $1 AND holder_id = $2 AND epoch = $3 FOR NO KEY UPDATE`)
)

// Taken is a conversation a holder took, and what the take-over found of
// the holder before it.
type Taken struct {
	arbortype.Conversation
	// PrevHolder is the former holder's row (0: it had none).
	PrevHolder int64
	// PrevRestarted says the former holder's last renewal came before the
	// database server's start.
	PrevRestarted bool
}

// NewHolder inserts a new holder row (a life) named name, live for ttl,
// and returns its id.
func (s *Store) NewHolder(ctx context.Context, db DB, name string, ttl time.Duration) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, s.sql[qNewHolder], name, micros(ttl)).Scan(&id)
	return id, err
}

// RenewHolder extends holder row id by ttl from now, if it has not expired.
// It reports whether it did: false when the row expired (or is gone).
func (s *Store) RenewHolder(ctx context.Context, db DB, id int64, ttl time.Duration) (bool, error) {
	var got int64
	err := db.QueryRow(ctx, s.sql[qRenewHolder], id, micros(ttl)).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// EndHolder removes holder row id if no conversation names it any more,
// and reports whether it did.
func (s *Store) EndHolder(ctx context.Context, db DB, id int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qEndHolder], id)
	return tag.RowsAffected() == 1, err
}

// PruneHolders removes up to limit holder rows expired for longer than
// after that no conversation names, and returns how many.
func (s *Store) PruneHolders(ctx context.Context, db DB, after time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, s.sql[qPruneHolders], micros(after), limit)
	return tag.RowsAffected(), err
}

// TakeConversation gives the conversation to holder (name and row id) with
// a fresh epoch, if it has no live holder. ErrNoRows when another holder's
// lease is live, when another transaction holds the row right now (skipped,
// not waited for), or when the conversation does not exist. The row stays
// locked until the transaction ends: recovery runs under it.
func (s *Store) TakeConversation(ctx context.Context, db DB, id, holder string, holderID int64) (Taken, error) {
	var t Taken
	c, err := scanConversation(db.QueryRow(ctx, s.sql[qTakeConversation], id, holder, holderID), &t.PrevHolder, &t.PrevRestarted)
	t.Conversation = c
	return t, err
}

// LockHeldConversation locks the conversation if holder row holderID still
// holds it at epoch (announcing it at commit, as LockConversation does).
// ErrNoRows when it does not.
func (s *Store) LockHeldConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qLockHeldConversation], id, holderID, epoch, s.ChangeChannel()), &notified)
}

// TryLockHeldConversation is LockHeldConversation that does not wait: a
// conversation another transaction holds locked is ErrNoRows too.
func (s *Store) TryLockHeldConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (arbortype.Conversation, error) {
	var notified any
	return scanConversation(db.QueryRow(ctx, s.sql[qTryLockHeldConversation], id, holderID, epoch, s.ChangeChannel()), &notified)
}

// ReleaseConversation frees a conversation holder row holderID holds at
// epoch. It reports whether it did (false: it had been taken over already).
func (s *Store) ReleaseConversation(ctx context.Context, db DB, id string, holderID, epoch int64) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qReleaseConversation], id, holderID, epoch)
	return tag.RowsAffected() == 1, err
}

// FenceConversation locks the conversation if holder row holderID still
// holds it at epoch. ErrNoRows when it does not: the caller lost its lease.
func (s *Store) FenceConversation(ctx context.Context, db DB, id string, holderID, epoch int64) error {
	var e int64
	return db.QueryRow(ctx, s.sql[qFenceConversation], id, holderID, epoch).Scan(&e)
}

// The maintenance leader (migration 002): the runner whose holder row the
// one row of maintenance_leader names, while that holder row is live. Its
// lease is its holder row's: the leader renews nothing more.

// leaderLive says that the leader row l names a live holder.
const leaderLive = `coalesce((SELECT hl.expires_at >= now() FROM {schema}.holders hl WHERE hl.id = l.holder_id), false)`

var (
	// Read by every runner at each of its maintenance ticks: no lock, no
	// write, while a leader is live.
	qLeader = define(`SELECT coalesce(l.holder_id, 0), ` + leaderLive + ` FROM {schema}.maintenance_leader l`)

	// An election, in one transaction, only when qLeader found no live
	// leader: the row is made if it is missing, and locked (an ON
	// CONFLICT DO UPDATE locks the row its WHERE leaves alone), so that
	// electors take turns; then qTakeLeader, a statement of its own whose
	// snapshot is taken after the lock, sees every holder row and every
	// election committed before it, and takes the row only if it still
	// names no live holder.
	qLockLeader = define(`INSERT INTO {schema}.maintenance_leader (holder_id) VALUES (NULL)
		ON CONFLICT (singleton) DO UPDATE SET holder_id = EXCLUDED.holder_id WHERE false`)
	// The candidate's own holder row must be live: a runner whose row
	// expired (frozen past its lease) never leads with it.
	qTakeLeader = define(`UPDATE {schema}.maintenance_leader l SET holder_id = $1, elected_at = now()
		WHERE NOT ` + leaderLive + `
		  AND EXISTS (SELECT 1 FROM {schema}.holders hc WHERE hc.id = $1 AND hc.expires_at >= now())
		RETURNING l.holder_id`)
)

// Leader returns the holder row the maintenance leader's row names (0:
// none, or no row), and whether that holder row is live.
func (s *Store) Leader(ctx context.Context, db DB) (holderID int64, live bool, err error) {
	err = db.QueryRow(ctx, s.sql[qLeader]).Scan(&holderID, &live)
	if IsNoRows(err) {
		return 0, false, nil
	}
	return holderID, live, err
}

// ElectLeader makes holder row holderID, if it is live, the maintenance
// leader if no live holder is, and reports whether it did. tx is the election's own
// transaction: the leader's row stays locked until it ends.
func (s *Store) ElectLeader(ctx context.Context, tx DB, holderID int64) (bool, error) {
	if _, err := tx.Exec(ctx, s.sql[qLockLeader]); err != nil {
		return false, err
	}
	var got int64
	err := tx.QueryRow(ctx, s.sql[qTakeLeader], holderID).Scan(&got)
	if IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}
