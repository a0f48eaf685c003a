-- The statements internal/store/inspect_ops.go runs. The names in braces are
-- filled in once at start-up ({schema}, the column and status lists: see
-- store.SQL).
--
-- The web view's operator reads (package arborui, issue 41 "The operator's
-- view"): what tells a queued turn from stuck work, the context of an
-- await, and the turns over time. Like inspect.sql's they read only, take
-- no lock, and each is bounded: it reads at most a number of rows its
-- caller chooses, along an index.


-- For each conversation of a page of a listing ($1): its oldest live turn
-- (root task), read along the live index; the pending turns behind it
-- (queued: the generation rule runs a conversation's turns oldest first),
-- at most $3; its running tasks past their task lease, at most $3; whether
-- a pending task that is not a queued turn was created more than $2
-- microseconds ago (by the database's clock); and the database's clock.
--
-- ConversationStates reads, for each of a page of conversations, what
-- tells a turn queued behind a live one from work that is stuck.
--
-- Locks: none (a read).
-- name: ConversationStates
SELECT c.id, now(), coalesce(r.first, 0),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.tasks q WHERE q.conversation_id = c.id AND q.status = 'pending'
        AND q.owner_task_id IS NULL AND q.id > r.first LIMIT $3) x),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.tasks o WHERE o.conversation_id = c.id AND o.status = 'running'
        AND o.lease_expires_at < now() LIMIT $3) y),
    EXISTS (SELECT 1 FROM {schema}.tasks p WHERE p.conversation_id = c.id AND p.status = 'pending'
        AND p.created_at < now() - $2 * interval '1 microsecond'
        AND NOT (p.owner_task_id IS NULL AND p.id > coalesce(r.first, p.id)))
FROM {schema}.conversations c
CROSS JOIN LATERAL (SELECT min(f.id) AS first FROM {schema}.tasks f
    WHERE f.conversation_id = c.id AND f.status IN ({live}) AND f.owner_task_id IS NULL) r
WHERE c.id = ANY($1::text[]);

-- NewestRootID reads the id of the newest turn (root task) of a
-- conversation, along the owner index. ErrNoRows when it has none.
--
-- Locks: none (a read).
-- name: NewestRootID
SELECT max(t.id) FROM {schema}.tasks t WHERE t.conversation_id = $1 AND t.owner_task_id IS NULL HAVING max(t.id) IS NOT NULL;

-- LiveRootIDs reads up to limit live turns (root tasks) of a conversation,
-- the oldest first, along the live index.
--
-- Locks: none (a read).
-- name: LiveRootIDs
SELECT t.id FROM {schema}.tasks t
WHERE t.conversation_id = $1 AND t.status IN ({live}) AND t.owner_task_id IS NULL
ORDER BY t.id LIMIT $2;

-- AwaitContexts reads what the handlers saved with the awaits of a page
-- of them ($1, task ids, probed by primary key): each task's checkpoint
-- state cut to $2 characters, with its whole length.
--
-- Locks: none (a read).
-- name: AwaitContexts
SELECT t.id, coalesce(left(t.state::text, $2), ''), coalesce(length(t.state::text), 0)
FROM {schema}.tasks t WHERE t.id = ANY($1::bigint[]);

-- The turns (root tasks) settled in the last $1 microseconds, by tenant
-- and minute, with the failed ones: a range of the settled roots' index
-- (the window's settles, read backwards from now when $2 is well below
-- them), at most $2 rows kept.
--
-- SettledTurnsPerMinute counts the turns settled, and failed, per tenant
-- and minute, over the last window, reading at most scan of them.
--
-- Locks: none (a read).
-- name: SettledTurnsPerMinute
SELECT t.tenant, date_trunc('minute', t.settled_at), count(*), count(*) FILTER (WHERE t.status = 'failed')
FROM (SELECT s.tenant, s.settled_at, s.status FROM {schema}.tasks s
    WHERE s.owner_task_id IS NULL AND s.settled_at IS NOT NULL AND s.settled_at >= now() - $1 * interval '1 microsecond'
    ORDER BY s.settled_at DESC LIMIT $2) t
GROUP BY 1, 2 ORDER BY 2, 1;

-- The turns (root tasks) among the newest $2 tasks (the primary key read
-- backwards) that started in the last $1 microseconds, by tenant and
-- minute. Every row carries how many tasks the scan read (a scan that
-- read $2 may have missed a turn created before them that started late)
-- and the database's clock, and one row of nulls beside them stands for
-- no turn.
--
-- StartedTurnsPerMinute counts the turns started per tenant and minute
-- over the last window, among the newest scan tasks.
--
-- Locks: none (a read).
-- name: StartedTurnsPerMinute
WITH scan AS (
    SELECT s.tenant, s.owner_task_id, s.started_at FROM {schema}.tasks s ORDER BY s.id DESC LIMIT $2),
bounds AS (SELECT count(*) AS n, now() AS now FROM scan)
SELECT b.n, b.now, r.tenant, r.minute, r.started FROM bounds b LEFT JOIN LATERAL (
    SELECT x.tenant, date_trunc('minute', x.started_at) AS minute, count(*) AS started FROM scan x
    WHERE x.owner_task_id IS NULL AND x.started_at >= now() - $1 * interval '1 microsecond'
    GROUP BY 1, 2) r ON true
ORDER BY r.minute, r.tenant;

-- The tenants with pending tasks, found along the fair claim's index
-- (tenant, queue_at) one tenant at a time (a skip scan: one probe per
-- tenant, however many tasks each has), at most $1 tenants; for each, its
-- pending tasks counted up to $2 (in the index's order, reading its
-- columns only, so that an index-only scan stops there: a bitmap scan
-- would read them all first), and the creation time of the first in
-- its queue (the oldest, unless a priority moved a newer one ahead); and
-- the database's clock.
--
-- PendingByTenant reads each tenant's pending depth, counted up to a
-- bound, and the age of the head of its queue.
--
-- Locks: none (a read).
-- name: PendingByTenant
WITH RECURSIVE ten (tenant) AS (
    (SELECT t.tenant FROM {schema}.tasks t WHERE t.status = 'pending' ORDER BY t.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT t.tenant FROM {schema}.tasks t WHERE t.status = 'pending' AND t.tenant > ten.tenant
        ORDER BY t.tenant LIMIT 1)
    FROM ten WHERE ten.tenant IS NOT NULL)
SELECT ten.tenant,
    (SELECT count(*) FROM (SELECT p.queue_at FROM {schema}.tasks p WHERE p.status = 'pending' AND p.tenant = ten.tenant
        ORDER BY p.tenant, p.queue_at LIMIT $2) x),
    (SELECT h.created_at FROM {schema}.tasks h WHERE h.status = 'pending' AND h.tenant = ten.tenant ORDER BY h.queue_at LIMIT 1),
    now()
FROM (SELECT * FROM ten WHERE ten.tenant IS NOT NULL LIMIT $1) ten
ORDER BY ten.tenant;
