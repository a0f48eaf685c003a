-- The statements internal/store/tree.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Tree queries. Owners always have smaller ids than their children (the
-- tasks table checks owner_task_id < id), so ascending id order is ancestors
-- first, and descending id order settles every child before its owner.


-- Every live task of conversation $1 (ids, ascending), read without a lock
-- as LiveSubtreeIDs is.
--
-- Run by Store.LiveConversationTaskIDs.
--
-- Locks: none (a read).
-- name: LiveConversationIDs
SELECT id FROM {schema}.tasks
WHERE conversation_id = $1 AND status IN ({live}) ORDER BY id;

-- $1 the ids in settle order, $2 their statuses, $3 the ids whose error
-- becomes $4, $5 the conversation; the rows are locked by the transaction
-- already (LockLiveTasks). They are read by their row addresses (ctid =
-- ANY, a TID scan whatever the statistics), which a LATERAL lookup by
-- primary key per id, fenced as the walk's, collects once (an InitPlan): no
-- join between the ids and the table that the planner could plan as a scan
-- of the whole table, as "FROM unnest(…) WHERE t.id = v.task_id" was (a hash
-- join over a sequential scan of every task of every conversation). A locked
-- row's address does not change before this transaction writes it. Each
-- row's status and settle number are looked up in a jsonb object built once
-- (a binary search of its keys; MATERIALIZED, so that it is not built again
-- for every row). The row addresses are the only test of the rows: a test of
-- their conversation besides let the planner read the whole conversation by
-- its index and filter the addresses, for every chunk of an abort. The
-- settle numbers are drawn in the same statement, once (a CTE), sorted, and
-- given in the order of $1. m's columns are named apart from the tasks',
-- which RETURNING lists unqualified.
--
-- Run by Store.AbortMany.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: SettleMany
WITH w AS (WITH seqs AS (
        SELECT array_agg(n ORDER BY n) AS seqs FROM (
            SELECT nextval('{schema}.task_settle_seq'::regclass) AS n
            FROM generate_series(1, cardinality($1::bigint[]))) q),
    m AS MATERIALIZED (
        SELECT jsonb_object_agg(x.task_id::text, jsonb_build_array(x.to_status, seqs.seqs[x.ord])) AS m
        FROM seqs, unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS x(task_id, to_status, ord))
    UPDATE {schema}.tasks t
    SET status = m.m->(t.id::text)->>0, settle_seq = (m.m->(t.id::text)->>1)::bigint, abort_requested = true,
        settled_at = now(), token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
        error = CASE WHEN t.id = ANY($3) THEN $4::jsonb ELSE t.error END
    FROM m
    WHERE t.ctid = ANY(ARRAY(SELECT l.ctid FROM unnest($1::bigint[]) AS s(id)
            CROSS JOIN LATERAL (SELECT ctid FROM {schema}.tasks WHERE id = s.id AND conversation_id = $5 OFFSET 0) l))
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w ORDER BY settle_seq;

-- The live foreground subtrees of $1 (ids, ascending), read without a lock:
-- the caller holds the conversation's row, and every writer that creates a
-- task or changes a status there takes it first (docs/design.md §5), so the
-- set cannot change before the caller locks it, chunk by chunk
-- (LockLiveTasks).
--
-- LiveSubtreeIDs returns the ids of each live task among rootIDs with all
-- its live descendants that are not background (a background child, and
-- everything under it, is left out), ascending, without locking them: the
-- caller holds the conversation's row lock.
--
-- Locks: none (a read).
-- name: LiveSubtreeIDs
WITH RECURSIVE sub(id) AS (
    SELECT id FROM {schema}.tasks
    WHERE conversation_id = $2 AND id = ANY($1) AND status NOT IN ({settled})
    UNION
    SELECT c.id FROM sub s CROSS JOIN LATERAL (SELECT t.id FROM {schema}.tasks t
        WHERE t.conversation_id = $2 AND t.owner_task_id = s.id
          AND t.status NOT IN ({settled}) AND NOT t.background OFFSET 0) c)
SELECT DISTINCT id FROM sub ORDER BY id;

-- The live tasks among $1 (ascending), locked one at a time by primary key
-- in id order, in a LATERAL subquery that the lock keeps the planner from
-- flattening into a join planned on statistics.
--
-- LockLiveTasks locks and returns the live tasks among ids (ascending, of
-- conversation conv), in ascending id order; a settled one is left out.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: LockLiveTasks
SELECT l.* FROM unnest($1::bigint[]) AS s(id)
CROSS JOIN LATERAL (SELECT {task_columns} FROM {schema}.tasks
    WHERE id = s.id AND conversation_id = $2 AND status NOT IN ({settled}) FOR NO KEY UPDATE) l
ORDER BY l.id;
