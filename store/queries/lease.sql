-- The statements internal/store/lease.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Holders and conversation leases (docs/design.md §3.8, package machine's
-- doc). A holder is one row of the holders table — a life of a runner's
-- node, or one machine.Lease — and holds every conversation whose holder_id
-- names it while its deadline (expires_at, by the database's clock) has not
-- passed. Taking a conversation over bumps its epoch, so every fence a
-- former holder writes with fails. Only the holder's own renewal locks its
-- row: take-overs read it.
--
-- A conversation c is free to take when it has no holder or its holder's
-- row's deadline has passed.
--
-- "Task t's conversation has no live holder" is tested found by
-- primary key: a scalar subquery, not NOT EXISTS, so that a scan of pending
-- tasks in id order stays one (see OpenConversations in node.sql). The join on
-- coalesce(h.holder_id, 0) does not imply holder_id IS NOT NULL, the
-- predicate of the partial holder index, so that index cannot serve the
-- probe: over statistics that showed it empty, the probe read it whole for
-- every task (every conversation the node held), 2.7 s for an open in bench
-- (l).
--
-- "Conversation c has a running task" is found through the live index by
-- conversation: a scalar subquery, for the same reason.
--
-- prev_holder and prev_restarted are what a take-over reports of the holder it took c from: its
-- id (0: none), and whether its last renewal came before the server's start
-- (a database restart lapsed it: the restarts it leaves are not counted) or
-- before the server's promotion (a failover did): a promoted standby's
-- pg_postmaster_start_time() is its start as a standby, long before, while
-- pg_last_xact_replay_timestamp() stays at the last commit it replayed
-- before the promotion, which no renewal on the old primary came after.


-- NewHolder inserts a new holder row (a life) named name, live for ttl, and
-- returns its id.
--
-- Locks: row locks on what it writes (inserts into holders), held until the
-- transaction ends.
-- name: NewHolder
INSERT INTO {schema}.holders (name, expires_at)
VALUES ($1, now() + $2 * interval '1 microsecond') RETURNING id, created_at;

-- DatabaseIdentity names the database a life lock file belongs to: the
-- cluster's system identifier (kept by its standbys, so a failover changes
-- nothing) and the database's name.
--
-- Locks: none (reads the control file and the session).
-- name: DatabaseIdentity
SELECT (SELECT system_identifier FROM pg_control_system())::text || '/' || current_database();

-- A life proven dead (machine's life locks: a runner of the same host got
-- the lock the dead process held on its life's file) ends at once: its
-- deadline is put just past, and ended_by names the prover. Only the life
-- the file names (id, name and birth), only while it is live and was never
-- ended, and only by a prover whose own row is live (the holders' guard
-- holds the same).
--
-- EndDeadHolder ends holder row id (named name, created at created) on the
-- proof of holder row by, and reports whether it did: false when the row is
-- gone, expired or ended already, or is another life.
--
-- Locks: row locks on what it writes (updates holders), held until the
-- transaction ends.
-- name: EndDeadHolder
UPDATE {schema}.holders h SET expires_at = now() - interval '1 microsecond', ended_by = $4
WHERE h.id = $1 AND h.name = $2 AND h.created_at = $3 AND h.expires_at >= now() AND h.ended_by IS NULL
  AND h.id <> $4
  AND EXISTS (SELECT 1 FROM {schema}.holders p WHERE p.id = $4 AND p.expires_at >= now())
RETURNING h.id;

-- A renewal extends a live row only: a row whose deadline passed may have
-- lost conversations to take-overs, and its holder must find out which
-- before it acts again (it starts a new life). It never brings the deadline
-- closer (a shorter ttl, the database's clock stepped back), which the
-- holders' guard refuses: the holder's fence counts from the deadline it was
-- promised.
--
-- RenewHolder extends holder row id by ttl from now, if it has not expired.
-- It reports whether it did: false when the row expired (or is gone).
--
-- Locks: row locks on what it writes (updates holders), held until the
-- transaction ends.
-- name: RenewHolder
UPDATE {schema}.holders SET expires_at = greatest(expires_at, now() + $2 * interval '1 microsecond'), renewed_at = now()
WHERE id = $1 AND expires_at >= now() RETURNING id;

-- A holder that is done (a stopped runner, a released Lease) removes its
-- row, if it holds nothing any more.
--
-- EndHolder removes holder row id if no conversation names it any more, and
-- reports whether it did.
--
-- Locks: row locks on what it writes (deletes from holders), held until the
-- transaction ends.
-- name: EndHolder
DELETE FROM {schema}.holders h WHERE h.id = $1
AND NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = h.id);

-- Lives long over that hold nothing, removed a batch at a time.
--
-- PruneHolders removes up to limit holder rows expired for longer than after
-- that no conversation names, and returns how many.
--
-- Locks: row locks on what it writes (deletes from holders), held until the
-- transaction ends.
-- name: PruneHolders
DELETE FROM {schema}.holders WHERE id IN (
    SELECT h.id FROM {schema}.holders h
    WHERE h.expires_at < now() - $1 * interval '1 microsecond'
  AND NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = h.id)
    ORDER BY h.id LIMIT $2);

-- SKIP LOCKED: a conversation another holder is taking over right now (or
-- that a transaction is working on) is skipped, not waited for; the caller
-- comes back to it.
--
-- TakeConversation gives the conversation to holder (name and row id) with a
-- fresh epoch, if it has no live holder. ErrNoRows when another holder's
-- lease is live, when another transaction holds the row right now (skipped,
-- not waited for), or when the conversation does not exist. The row stays
-- locked until the transaction ends: recovery runs under it.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds; row locks on what it writes (updates
-- conversations), held until the transaction ends.
-- name: TakeConversation
WITH picked AS (
    SELECT c.id, coalesce(c.holder_id, 0) AS prev_holder,
        coalesce((SELECT hp.renewed_at < pg_postmaster_start_time() OR hp.renewed_at <= pg_last_xact_replay_timestamp()
                  FROM {schema}.holders hp WHERE hp.id = c.holder_id), false) AS prev_restarted
    FROM {schema}.conversations c
    WHERE c.id = $1 AND (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))
    FOR NO KEY UPDATE OF c SKIP LOCKED)
UPDATE {schema}.conversations c
SET holder = $2, holder_id = $3, epoch = c.epoch + 1, updated_at = now()
FROM picked WHERE c.id = picked.id
RETURNING c.id, coalesce(c.holder, ''), c.epoch,
    (SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant, picked.prev_holder, picked.prev_restarted;

-- The release locks the row (the engine requeues the holder's running tasks
-- in the same transaction, see LockHeldConversation) and frees it.
--
-- LockHeldConversation locks the conversation if holder row holderID still
-- holds it at epoch (announcing it at commit, as LockConversation does).
-- ErrNoRows when it does not.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), held until the
-- transaction ends.
-- name: LockHeldConversation
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant, pg_notify($4, c.id) FROM {schema}.conversations c
WHERE c.id = $1 AND c.holder_id = $2 AND c.epoch = $3 FOR NO KEY UPDATE OF c;

-- The same, skipping a row another transaction holds (the runner's audit,
-- which must not wait: no row is returned then either).
--
-- TryLockHeldConversation is LockHeldConversation that does not wait: a
-- conversation another transaction holds locked is ErrNoRows too.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds, held until the transaction ends.
-- name: TryLockHeldConversation
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant, pg_notify($4, c.id) FROM {schema}.conversations c
WHERE c.id = $1 AND c.holder_id = $2 AND c.epoch = $3 FOR NO KEY UPDATE OF c SKIP LOCKED;

-- ReleaseConversation frees a conversation holder row holderID holds at
-- epoch. It reports whether it did (false: it had been taken over already).
--
-- Locks: row locks on what it writes (updates conversations), held until the
-- transaction ends.
-- name: ReleaseConversation
UPDATE {schema}.conversations
SET holder = NULL, holder_id = NULL, updated_at = now()
WHERE id = $1 AND holder_id = $2 AND epoch = $3;

-- Locked: a take-over (an UPDATE of the row) waits for the fenced
-- transaction to end, and the fenced transaction, if it comes second, sees
-- the new epoch. Exclusively (FOR NO KEY UPDATE), as every writer of the
-- conversation's log holds it, so that the log's order is its commit order.
--
-- FenceConversation locks the conversation if holder row holderID still
-- holds it at epoch. ErrNoRows when it does not: the caller lost its lease.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: FenceConversation
SELECT epoch FROM {schema}.conversations
WHERE id = $1 AND holder_id = $2 AND epoch = $3 FOR NO KEY UPDATE;

-- The maintenance leader (docs/architecture.md, "One runner maintains the
-- schema"): the runner whose holder row the one row of maintenance_leader
-- names, while that holder row is live. Its lease is its holder row's: the
-- leader renews nothing more.
--
-- Leader returns the holder row the leader's row names (0: none) and
-- whether that holder row is live. Read by every runner at each of its
-- maintenance ticks.
--
-- Locks: none.
-- name: Leader
SELECT coalesce(l.holder_id, 0),
    coalesce((SELECT hl.expires_at >= now() FROM {schema}.holders hl WHERE hl.id = l.holder_id), false)
FROM {schema}.maintenance_leader l;

-- An election, in one transaction, only when Leader found no live leader.
-- LockLeader makes the row if it is missing, and locks it (an ON CONFLICT
-- DO UPDATE locks the row its WHERE leaves alone), so that electors take
-- turns; then TakeLeader, a statement of its own whose snapshot is taken
-- after the lock, sees every holder row and every election committed
-- before it.
--
-- Locks: the leader's row, FOR UPDATE, until the transaction ends.
-- name: LockLeader
INSERT INTO {schema}.maintenance_leader (holder_id) VALUES (NULL)
ON CONFLICT (singleton) DO UPDATE SET holder_id = EXCLUDED.holder_id WHERE false;

-- TakeLeader makes holder row $1 the leader if the row still names no live
-- holder and $1's own holder row is live (a runner whose row expired,
-- frozen past its lease, never leads with it).
--
-- Locks: the leader's row (held already, by LockLeader).
-- name: TakeLeader
UPDATE {schema}.maintenance_leader l SET holder_id = $1, elected_at = now()
WHERE NOT coalesce((SELECT hl.expires_at >= now() FROM {schema}.holders hl WHERE hl.id = l.holder_id), false)
  AND EXISTS (SELECT 1 FROM {schema}.holders hc WHERE hc.id = $1 AND hc.expires_at >= now())
RETURNING l.holder_id;
