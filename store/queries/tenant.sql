-- The statements internal/store/tenant.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Tenants' weights, concurrency limits, and queued tasks that expired
-- (docs/design.md §3.15).


-- SetTenantWeight sets the weight of tenant in the fair claim.
--
-- Locks: row locks on what it writes (inserts into tenants, or updates it),
-- held until the transaction ends.
-- name: SetTenantWeight
INSERT INTO {schema}.tenants (tenant, weight) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE SET weight = EXCLUDED.weight, updated_at = now();

-- Tenants lists the tenants given a weight, by name.
--
-- Locks: none (a read).
-- name: Tenants
SELECT tenant, weight, updated_at FROM {schema}.tenants ORDER BY tenant;

-- SetLimit sets concurrency limit key to max, and says whether it is new.
--
-- Locks: row locks on what it writes (inserts into concurrency_limits, or
-- updates it), held until the transaction ends.
-- name: SetLimit
INSERT INTO {schema}.concurrency_limits AS l (key, max) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET max = EXCLUDED.max, updated_at = now()
RETURNING l.xmax = 0;

-- A new limit counts the runs under way when it is set (adopted): each
-- running task of its key, found from the held conversations (a running
-- task's conversation always has a holder), names it in its slots, and
-- the count is set to the runs naming it, all under the limit's row lock,
-- which every start of the key takes too (task_slots).
--
-- LockLimit locks limit key, and says whether it exists.
--
-- Locks: FOR UPDATE on the rows it selects, held until the transaction
-- ends.
-- name: LockLimit
SELECT true FROM {schema}.concurrency_limits WHERE key = $1 FOR UPDATE;

-- AdoptRuns names limit key in the slots of every running task of the key
-- that does not name it yet.
--
-- Locks: row locks on what it writes (updates tasks), held until the
-- transaction ends.
-- name: AdoptRuns
UPDATE {schema}.tasks t SET slots = array_append(coalesce(t.slots, '{}'), $1), updated_at = now()
FROM {schema}.conversations c
WHERE c.holder_id IS NOT NULL AND t.conversation_id = c.id AND t.status = 'running'
  AND $1 IN ('tenant:' || t.tenant, 'kind:' || t.kind, 'key:' || t.concurrency_key)
  AND NOT ($1 = ANY(coalesce(t.slots, '{}')));

-- CountSlots sets the running count of limit key to the runs whose slots
-- name it.
--
-- Locks: row locks on what it writes (updates concurrency_limits), held
-- until the transaction ends.
-- name: CountSlots
UPDATE {schema}.concurrency_limits l SET running = (
    SELECT count(*) FROM {schema}.conversations c JOIN {schema}.tasks t ON t.conversation_id = c.id
    WHERE c.holder_id IS NOT NULL AND t.status = 'running' AND l.key = ANY(t.slots)), updated_at = now()
WHERE l.key = $1;

-- DeleteLimit removes limit key; the runs naming it give back nothing when
-- they end.
--
-- Locks: row locks on what it writes (deletes from concurrency_limits),
-- held until the transaction ends.
-- name: DeleteLimit
DELETE FROM {schema}.concurrency_limits WHERE key = $1;

-- Limits lists the concurrency limits by key, with their running counts.
--
-- Locks: none (a read).
-- name: Limits
SELECT key, max, running, updated_at FROM {schema}.concurrency_limits ORDER BY key;

-- SlotCounts reads, in one statement (one snapshot), every concurrency
-- limit's running count beside the runs whose slots name it: the checker's
-- invariant 13.
--
-- Locks: none (a read).
-- name: SlotCounts
SELECT l.key, l.running, (
    SELECT count(*) FROM {schema}.conversations c JOIN {schema}.tasks t ON t.conversation_id = c.id
    WHERE c.holder_id IS NOT NULL AND t.status = 'running' AND l.key = ANY(t.slots))
FROM {schema}.concurrency_limits l ORDER BY l.key;

-- ExpiredInQueue lists up to limit pending tasks that never started and
-- whose time to live in the queue passed, oldest first.
--
-- Locks: none (a read).
-- name: ExpiredInQueue
SELECT t.id FROM {schema}.tasks t
WHERE t.status = 'pending' AND t.queue_expires_at IS NOT NULL AND t.queue_expires_at <= now() AND t.started_at IS NULL
ORDER BY t.queue_expires_at LIMIT $1;
