-- The statements internal/store/node.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- The node runner's statements: each covers every conversation (or task) of
-- a batch at once.
--
-- An open returns, of each conversation it took, its
-- id and new epoch, the transaction's id, and whether recovery has anything
-- to look at (a task running under a former holder, a wait or a completing
-- task that might need repair); a conversation with none of them needs no
-- reconcile_on_open. The probe is a scalar subquery through the live index
-- by conversation (see lease.sql): as EXISTS it was planned as a scan of
-- every task.
--
-- The dead-holder branch of an open lists, as d.id, the conversations of
-- expired holders with a run under them: read from each expired holder (the holders table holds a
-- row per node's life), its conversations through the holder index, at
-- most a bound of them per holder (a LATERAL subquery with a LIMIT, which
-- the planner cannot turn into a join over the whole table). Written as a
-- join of the holders to the conversations, PostgreSQL 17 and 18 planned
-- the UNION it is a branch of as an ordered merge, and this branch as a
-- scan of every conversation in key order, each tested for its holder: an
-- open over a backlog of 20,000 did 27,100 rows of work (6,702 on 15),
-- 447 ms against 30 ms (TestOpenKeepsItsPlanWithABacklog, issue 38). The
-- statements add to its WHERE clause and bound the whole.


-- Conversations that have work for a node and no live holder: a pending task
-- of a known kind (found from the oldest pending tasks, through the pending
-- index: a bounded scan, whatever the number of conversations), or a lease
-- that expired with a run under it (a dead node's). Taken in one statement;
-- conversations another transaction holds are skipped.
--
-- The oldest pending tasks are read in id order from the pending index, each
-- tested for a live holder by primary key (see lease.sql): the test is a
-- scalar subquery, which the planner cannot turn into an anti-join, and
-- whose selectivity it guesses at one half. Written as NOT EXISTS, it was
-- planned, over statistics taken while most conversations were held, as a
-- hash anti-join of every pending task against every held conversation,
-- sorted for the oldest: with a backlog of 800,000 pending conversations,
-- 1.8 s per statement (TestOpenKeepsItsPlanWithABacklog). A dead holder's
-- conversations are found from the expired holders (the dead-holder branch below) and each
-- probed for a run, for the same reason: as EXISTS, the probe was
-- planned as a scan of every task for the running ones. Both branches are
-- bounded ($5): an open takes what it finds, the next finds the rest, and
-- the plan's estimate stays small whatever the statistics say of the dead
-- holders. (Estimated at 518,000 rows, it cost 5,000,000, and PostgreSQL's
-- JIT, which compiles a plan that costs more than jit_above_cost, took 569
-- ms of a 694 ms open.) The candidates are read by primary key (a LATERAL
-- subquery the planner cannot make a join over the whole table), the free
-- ones first (free), and only those are locked, each tested again once
-- locked; a conversation another transaction holds is skipped, and the next
-- open finds it.
--
-- The pending work is found fairly across tenants (docs/design.md §3.15),
-- in two bounded reads: the head of each tenant with pending work (its
-- task first in queue order), read from the index of each tenant's pending
-- tasks in queue order (tasks_pending_tenant_idx) by a loose index scan,
-- one probe of one row per tenant (a recursive CTE: an ordered probe with
-- LIMIT 1 is an index scan whatever the statistics, where a read of a
-- tenant's tasks was planned as a bitmap scan of all of them), at most $7
-- tenants, starting after the tenant $6 (null: from the first) and
-- wrapping around (the caller moves $6 past the tenants it served, so that
-- past $7 tenants every one gets its turn); and the $5 oldest pending
-- tasks by id (the depth, for a tenant with more than its head to run).
-- Those in conversations with a live holder are left out; the rest are
-- numbered within their tenant in queue order, and taken by their
-- tenant's share, as a claim takes tasks (node_claim.sql; $8, $9 the
-- node's runs in flight by tenant), ties in queue order. A dead holder's
-- conversations come first: recovery.
--
-- OpenConversations gives holder (its name and row) up to limit
-- conversations that have work for kinds (nil: any kind) and no live
-- holder, fairly across tenants (at most tenants of them, from the tenant
-- after, wrapping); scan bounds how many conversations of lapsed holders
-- are looked at. Their rows stay locked until the transaction ends.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds; row locks on what it writes (updates
-- conversations), held until the transaction ends.
-- name: OpenConversations
WITH RECURSIVE
    hi(tenant, id, conv, queue_at, kind, aborted, started_at, queue_expires_at, concurrency_key, n) AS (
        (SELECT t.tenant, t.id, t.conversation_id, t.queue_at, t.kind, t.abort_requested, t.started_at, t.queue_expires_at, t.concurrency_key, 1
        FROM {schema}.tasks t WHERE t.status = 'pending' AND ($6::text IS NULL OR t.tenant > $6) ORDER BY t.tenant, t.queue_at LIMIT 1)
        UNION ALL
        SELECT x.tenant, x.id, x.conversation_id, x.queue_at, x.kind, x.abort_requested, x.started_at, x.queue_expires_at, x.concurrency_key, hi.n + 1
        FROM hi CROSS JOIN LATERAL (
            SELECT t.tenant, t.id, t.conversation_id, t.queue_at, t.kind, t.abort_requested, t.started_at, t.queue_expires_at, t.concurrency_key
            FROM {schema}.tasks t WHERE t.status = 'pending' AND t.tenant > hi.tenant ORDER BY t.tenant, t.queue_at LIMIT 1) x
        WHERE hi.n < $7),
    lo(tenant, id, conv, queue_at, kind, aborted, started_at, queue_expires_at, concurrency_key, n) AS (
        (SELECT t.tenant, t.id, t.conversation_id, t.queue_at, t.kind, t.abort_requested, t.started_at, t.queue_expires_at, t.concurrency_key, 1
        FROM {schema}.tasks t WHERE t.status = 'pending' AND t.tenant <= $6 ORDER BY t.tenant, t.queue_at LIMIT 1)
        UNION ALL
        SELECT x.tenant, x.id, x.conversation_id, x.queue_at, x.kind, x.abort_requested, x.started_at, x.queue_expires_at, x.concurrency_key, lo.n + 1
        FROM lo CROSS JOIN LATERAL (
            SELECT t.tenant, t.id, t.conversation_id, t.queue_at, t.kind, t.abort_requested, t.started_at, t.queue_expires_at, t.concurrency_key
            FROM {schema}.tasks t WHERE t.status = 'pending' AND t.tenant > lo.tenant AND t.tenant <= $6 ORDER BY t.tenant, t.queue_at LIMIT 1) x
        WHERE lo.n < $7),
    heads AS (
        SELECT t.conversation_id, t.tenant, t.queue_at FROM (
            SELECT h.conv AS conversation_id, h.tenant, h.queue_at, h.kind, h.aborted, h.started_at, h.queue_expires_at, h.concurrency_key FROM (
                SELECT hi.* FROM hi UNION ALL SELECT lo.* FROM lo) h LIMIT $7) t
        WHERE NOT t.aborted AND ($3::text[] IS NULL OR t.kind = ANY($3)) AND {startable}
          AND NOT coalesce((SELECT true FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = coalesce(h.holder_id, 0)
        WHERE h.id = t.conversation_id AND hh.expires_at >= now()), false)),
    deep AS (
        SELECT t.conversation_id, t.tenant, t.queue_at FROM {schema}.tasks t
        WHERE t.status = 'pending' AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3)) AND {startable}
          AND NOT coalesce((SELECT true FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = coalesce(h.holder_id, 0)
        WHERE h.id = t.conversation_id AND hh.expires_at >= now()), false)
        ORDER BY t.id LIMIT $5),
    ranked AS (
        SELECT c.id, c.tenant, c.queue_at, row_number() OVER (PARTITION BY c.tenant ORDER BY c.queue_at, c.id) AS rn FROM (
            SELECT u.conversation_id AS id, min(u.tenant) AS tenant, min(u.queue_at) AS queue_at FROM (
                SELECT * FROM heads UNION ALL SELECT * FROM deep) u
            GROUP BY u.conversation_id) c),
    cand AS (
        (SELECT x.id, (x.rn - 1 + coalesce((SELECT b.n FROM unnest($8::text[], $9::int[]) b(tenant, n) WHERE b.tenant = x.tenant LIMIT 1), 0))::float8 / {weight} AS round, x.queue_at FROM ranked x)
        UNION ALL
        (SELECT d.id, -1::float8, NULL::timestamptz FROM {schema}.holders hx CROSS JOIN LATERAL (
        SELECT c.id FROM {schema}.conversations c
        WHERE c.holder_id = hx.id AND coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status = 'running' LIMIT 1), false) LIMIT $5) d
    WHERE hx.expires_at < now() LIMIT $5)),
    free AS (
        SELECT c.id FROM cand CROSS JOIN LATERAL (
            SELECT c.id, c.holder_id FROM {schema}.conversations c WHERE c.id = cand.id OFFSET 0) c
        WHERE (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))
        GROUP BY c.id
        ORDER BY min(cand.round), min(cand.queue_at) NULLS FIRST, c.id LIMIT $4),
    picked AS (
        SELECT c.id, coalesce(c.holder_id, 0) AS prev_holder,
    coalesce((SELECT hp.renewed_at < pg_postmaster_start_time() OR hp.renewed_at <= pg_last_xact_replay_timestamp() FROM {schema}.holders hp WHERE hp.id = c.holder_id), false) AS prev_restarted FROM {schema}.conversations c
        WHERE c.id IN (SELECT id FROM free) AND (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))
        ORDER BY c.id
        FOR NO KEY UPDATE OF c SKIP LOCKED)
    UPDATE {schema}.conversations c
    SET holder = $1, holder_id = $2, epoch = c.epoch + 1, updated_at = now()
    FROM picked WHERE c.id = picked.id
    RETURNING c.id, c.epoch, pg_current_xact_id()::text::bigint,
    coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status IN ('running', 'waiting', 'completing') LIMIT 1), false),
    picked.prev_holder, picked.prev_restarted, c.tenant;

-- Conversations named by their notifications, taken when they have work for
-- the node and no live holder: the same test as OpenConversations's, by
-- primary key. Every node hears every notification: the first to lock a
-- conversation takes it, the others skip it. The probes are scalar
-- subqueries by index (see OpenConversations): as EXISTS, each was planned
-- as a scan of every task, 0.3–0.9 s per statement with 800,000 pending.
--
-- OpenNamed is OpenConversations among the conversations ids only, fairly
-- across their tenants as OpenConversations is (a conversation is numbered
-- within its tenant by its oldest startable pending task).
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds; row locks on what it writes (updates
-- conversations), held until the transaction ends.
-- name: OpenNamed
WITH named AS (
    SELECT c.id, c.tenant, c.holder_id,
        (SELECT t.queue_at FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
            AND NOT t.abort_requested AND ($3::text[] IS NULL OR t.kind = ANY($3)) AND {startable}
            ORDER BY t.queue_at LIMIT 1) AS queue_at
    FROM {schema}.conversations c
    WHERE c.id = ANY($5) AND (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))),
ranked AS (
    SELECT n.id, n.tenant, n.queue_at, row_number() OVER (PARTITION BY n.tenant ORDER BY n.queue_at, n.id) AS rn FROM named n
    WHERE n.queue_at IS NOT NULL
       OR (n.holder_id IS NOT NULL AND coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = n.id AND r.status = 'running' LIMIT 1), false))),
chosen AS (
    SELECT x.id FROM ranked x
    ORDER BY CASE WHEN x.queue_at IS NULL THEN -1 ELSE (x.rn - 1 + coalesce((SELECT b.n FROM unnest($6::text[], $7::int[]) b(tenant, n) WHERE b.tenant = x.tenant LIMIT 1), 0))::float8 / {weight} END,
        x.queue_at NULLS FIRST, x.id LIMIT $4),
picked AS (
    SELECT c.id, coalesce(c.holder_id, 0) AS prev_holder,
    coalesce((SELECT hp.renewed_at < pg_postmaster_start_time() OR hp.renewed_at <= pg_last_xact_replay_timestamp() FROM {schema}.holders hp WHERE hp.id = c.holder_id), false) AS prev_restarted FROM {schema}.conversations c
    WHERE c.id IN (SELECT id FROM chosen) AND (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))
    ORDER BY c.id
    FOR NO KEY UPDATE OF c SKIP LOCKED)
UPDATE {schema}.conversations c
SET holder = $1, holder_id = $2, epoch = c.epoch + 1, updated_at = now()
FROM picked WHERE c.id = picked.id
RETURNING c.id, c.epoch, pg_current_xact_id()::text::bigint,
coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status IN ('running', 'waiting', 'completing') LIMIT 1), false),
picked.prev_holder, picked.prev_restarted, c.tenant;

-- A holder's own conversations after its fence fired (it could not confirm
-- its lease for a while, and its row has not expired): those still held by
-- it at the epochs it knows, locked in id order, skipping those another
-- transaction holds. The epoch stays: the holder's runs there are recovered
-- in the same transaction, which kills their tokens.
--
-- Reopen locks, in id order, the conversations among ids (at the epochs
-- given, same index) that holder row holderID still holds and no other
-- transaction holds, and returns them as an open would (their epochs
-- unchanged). Their rows stay locked until the transaction ends.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds, held until the transaction ends.
-- name: Reopen
WITH picked AS (
    SELECT c.id, coalesce(c.holder_id, 0) AS prev_holder,
    coalesce((SELECT hp.renewed_at < pg_postmaster_start_time() OR hp.renewed_at <= pg_last_xact_replay_timestamp() FROM {schema}.holders hp WHERE hp.id = c.holder_id), false) AS prev_restarted FROM {schema}.conversations c
    JOIN unnest($2::text[], $3::bigint[]) AS v(id, epoch) ON c.id = v.id AND c.epoch = v.epoch
    WHERE c.holder_id = $1
    ORDER BY c.id
    FOR NO KEY UPDATE OF c SKIP LOCKED)
SELECT c.id, c.epoch, pg_current_xact_id()::text::bigint,
coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status IN ('running', 'waiting', 'completing') LIMIT 1), false),
picked.prev_holder, picked.prev_restarted, c.tenant FROM picked JOIN {schema}.conversations c ON c.id = picked.id ORDER BY c.id;

-- How many conversations an open would find (at most $2): a full node
-- releases idle conversations for room only when there is something to open.
-- $3 names the conversations to look at (null: scan as OpenConversations
-- does, the $4 oldest pending tasks). The candidates are found first, each
-- branch through its index, and each conversation is then read by primary
-- key: a test of every conversation OR'ed across the branches was planned as
-- a scan of the whole table.
--
-- CountOpenable says how many conversations (at most limit) an open for
-- kinds would find among named (nil: by a scan of the oldest scan pending
-- tasks).
--
-- Locks: none (a read).
-- name: CountOpenable
SELECT count(*) FROM (
        SELECT 1 FROM (
            (SELECT t.conversation_id AS id FROM {schema}.tasks t
            WHERE $3::text[] IS NULL AND t.status = 'pending' AND NOT t.abort_requested
              AND ($1::text[] IS NULL OR t.kind = ANY($1)) AND NOT coalesce((SELECT true FROM {schema}.conversations h JOIN {schema}.holders hh ON hh.id = coalesce(h.holder_id, 0)
        WHERE h.id = t.conversation_id AND hh.expires_at >= now()), false)
            ORDER BY t.id LIMIT $4)
            UNION
            (SELECT d.id FROM {schema}.holders hx CROSS JOIN LATERAL (
        SELECT c.id FROM {schema}.conversations c
        WHERE c.holder_id = hx.id AND coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status = 'running' LIMIT 1), false) LIMIT $4) d
    WHERE hx.expires_at < now() AND $3::text[] IS NULL LIMIT $4)
            UNION
            SELECT unnest($3::text[])) cand
        CROSS JOIN LATERAL (
            SELECT c.* FROM {schema}.conversations c WHERE c.id = cand.id OFFSET 0) c
        WHERE (c.holder_id IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()))
          AND ($3::text[] IS NULL
            OR coalesce((SELECT true FROM {schema}.tasks t WHERE t.conversation_id = c.id
                AND t.status = 'pending' AND NOT t.abort_requested AND ($1::text[] IS NULL OR t.kind = ANY($1)) LIMIT 1), false)
            OR (c.holder_id IS NOT NULL AND coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status = 'running' LIMIT 1), false)))
        LIMIT $2) x;

-- RunningIn reads the running tasks of the conversations, in id order.
--
-- Locks: none (a read).
-- name: RunningIn
SELECT {task_columns} FROM {schema}.tasks
WHERE conversation_id = ANY($1) AND status = 'running' ORDER BY id;

-- Waits and completing tasks that recovery must repair: a waiting task whose
-- wait is satisfied, a completing task with no live foreground child. Only
-- what was written behind the engine's back has any.
--
-- ToRepair lists the waiting tasks with satisfied waits and the completing
-- tasks with no live foreground child in the conversations, deepest first.
--
-- Locks: none (a read).
-- name: ToRepair
SELECT w.id, w.status FROM {schema}.tasks w
WHERE w.conversation_id = ANY($1) AND (
    (w.status = 'waiting' AND (
        NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = w.id AND c.id = ANY(w.wait_ids) AND c.status IN ({live}))
        OR (w.wait_policy = 'fail_fast' AND EXISTS (SELECT 1 FROM {schema}.tasks c
            WHERE c.owner_task_id = w.id AND c.id = ANY(w.wait_ids) AND c.status IN ('failed', 'aborted', 'cancelled', 'orphaned')))))
    OR (w.status = 'completing' AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c
        WHERE c.owner_task_id = w.id AND NOT c.background AND c.status IN ({live}))))
ORDER BY w.id DESC;

-- Idle conversations released together: only those still held at the epochs
-- given with nothing running (a release with a run goes through the
-- one-by-one path, which recovers it).
--
-- ReleaseIdle frees the conversations holder holds at the epochs given (same
-- index) that have no running task, and returns those it freed.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), skipping rows
-- another transaction holds; row locks on what it writes (updates
-- conversations), held until the transaction ends.
-- name: ReleaseIdle
WITH locked AS (
    SELECT c.id FROM {schema}.conversations c
    JOIN unnest($1::text[], $2::bigint[]) AS v(id, epoch) ON c.id = v.id AND c.epoch = v.epoch
    WHERE c.holder_id = $3
    ORDER BY c.id FOR NO KEY UPDATE OF c SKIP LOCKED)
UPDATE {schema}.conversations c
SET holder = NULL, holder_id = NULL, updated_at = now()
FROM locked WHERE c.id = locked.id AND NOT coalesce((SELECT true FROM {schema}.tasks r WHERE r.conversation_id = c.id AND r.status = 'running' LIMIT 1), false)
RETURNING c.id;

-- The transaction's id, for resolving a commit whose outcome is unknown.
--
-- XactID returns the id of db's transaction (assigning one).
--
-- Locks: none (a read).
-- name: XactID
SELECT pg_current_xact_id()::text::bigint;

-- What became of a transaction: committed, aborted, in progress (null: too
-- old to know).
--
-- XactStatus says what became of transaction xact: "committed", "aborted",
-- "in progress", "" when it is too old to know, or "future" when the server
-- never gave the id out (pg_xact_status refuses an id past the server's next
-- one with 22023, its only refusal of a valid id: the server is not the one
-- the transaction ran on, but a standby promoted before the transaction's
-- records reached it).
--
-- Locks: none (a read).
-- name: XactStatus
SELECT coalesce(pg_xact_status($1::bigint::text::xid8), '');

-- The conversations among $1 held by $2 that have a pending task (work), and
-- among them those that no other transaction holds, locked in id order
-- (conversation rows first, as every transaction takes them; exclusively, as
-- every writer of a conversation's log holds it): a claim in them then
-- cannot skip their rows. One with no pending task has nothing for a claim,
-- and is not locked. The check and the locks share the statement's snapshot.
-- The check is a lateral subquery, run per conversation by the index of its
-- live tasks (as an EXISTS, the plan may hash every pending task of the
-- table instead). Its status and holder tests are the claim's (see
-- claimSQL): only the live index and the primary key serve them, whatever
-- the statistics (the holder's index would read every conversation the node
-- holds).
--
-- LockHeld locks, in id order, the conversations among ids that holder
-- holds, that have a pending task, and that no other transaction holds. It
-- returns those with a pending task (work) and, of them, those it locked.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, skipping rows another
-- transaction holds, held until the transaction ends.
-- name: LockHeld
WITH work AS MATERIALIZED (
    SELECT c.id FROM {schema}.conversations c
    CROSS JOIN LATERAL (SELECT 1 FROM {schema}.tasks t
        WHERE t.conversation_id = c.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
          AND NOT t.abort_requested LIMIT 1) p
    WHERE c.id = ANY($1) AND c.holder_id IS NOT DISTINCT FROM $2::bigint),
locked AS MATERIALIZED (
    SELECT c.id FROM {schema}.conversations c
    WHERE c.id = ANY(ARRAY(SELECT id FROM work)) AND c.holder_id IS NOT DISTINCT FROM $2::bigint
    ORDER BY c.id FOR NO KEY UPDATE SKIP LOCKED)
SELECT ARRAY(SELECT id FROM work ORDER BY id), ARRAY(SELECT id FROM locked ORDER BY id);

-- The conversations a holder row holds.
--
-- HeldBy lists the conversations holder row holder holds.
--
-- Locks: none (a read).
-- name: HeldBy
SELECT id, epoch FROM {schema}.conversations
WHERE holder_id = $1 ORDER BY id;
