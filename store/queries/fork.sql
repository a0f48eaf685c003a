-- The statements internal/store/fork.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Fork: a conversation's settled history copied into a new conversation
-- (docs/agents.md, "Fork: edit and regenerate"). Every copied row names its
-- source (forked_from) and the guard checks it is a faithful copy
-- (guardrules.ForkRules).
--
-- The forks' id maps are the copied tasks' old ids ($2) as the keys of a jsonb
-- object whose values are their copies' ids ($3); forkEventMap the same of
-- the events ($5, $6).


-- InsertForkConversation inserts conversation id for a fork, of the tenant
-- of conversation from, and reports false when it exists already.
--
-- Locks: row locks on what it writes (inserts into conversations), held
-- until the transaction ends.
-- name: InsertForkConversation
INSERT INTO {schema}.conversations (id, tenant) VALUES ($1, (SELECT f.tenant FROM {schema}.conversations f WHERE f.id = $2))
ON CONFLICT DO NOTHING RETURNING id;

-- The tasks a fork of conversation $1 through turn $2 copies: the settled
-- turns up to it with their settled subtrees (a live task, and what is under
-- it, is not history yet), ascending, with their settle numbers. Its walk
-- down is shaped as the abort's (internal/store/tree.go), so that its plan
-- does not depend on statistics.
--
-- Run by Store.CopyHistory.
--
-- Locks: none (a read).
-- name: ForkSource
WITH RECURSIVE tree AS (
    SELECT id, settle_seq FROM {schema}.tasks
    WHERE conversation_id = $1 AND owner_task_id IS NULL AND id <= $2 AND status NOT IN ({live})
    UNION ALL
    SELECT c.id, c.settle_seq FROM tree t CROSS JOIN LATERAL (SELECT c.id, c.settle_seq FROM {schema}.tasks c
        WHERE c.conversation_id = $1 AND c.owner_task_id = t.id AND c.status NOT IN ({live}) OFFSET 0) c)
SELECT id, settle_seq FROM tree ORDER BY id;

-- The events a fork copies: those of the copied tasks (addressed to one, or
-- delivered to one), ascending: $2, the copied ids, made the keys of a jsonb
-- object once, each event's tasks looked up in it.
--
-- Run by Store.CopyHistory.
--
-- Locks: none (a read).
-- name: ForkEvents
WITH ids AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.id::text, true), '{}'::jsonb) AS m
    FROM unnest($2::bigint[]) x(id))
SELECT e.id FROM {schema}.events e
WHERE e.conversation_id = $1
  AND ((SELECT m FROM ids) ? e.task_id::text OR (SELECT m FROM ids) ? e.delivered_to::text)
ORDER BY e.id;

-- Locks: none (nextval takes values of a sequence, never given back).
-- name: NextTaskIDs
SELECT nextval(pg_get_serial_sequence('{schema}.tasks', 'id')) FROM generate_series(1, $1);

-- Locks: none (nextval takes values of a sequence, never given back).
-- name: NextSettles
SELECT nextval('{schema}.task_settle_seq') FROM generate_series(1, $1);

-- Locks: none (nextval takes values of a sequence, never given back).
-- name: NextEventIDs
SELECT nextval(pg_get_serial_sequence('{schema}.events', 'id')) FROM generate_series(1, $1);

-- $1 the new conversation; $2, $3 the old and new task ids; $4 the old ids'
-- new settle numbers; $5, $6 the old and new event ids. Every source row is
-- read by its primary key (a LATERAL subquery fenced by OFFSET 0), and every
-- old id (an owner, a waited task, a delivered event) is turned into its
-- copy's through a jsonb object built once (ids, evs: a binary search of its
-- keys), never by a join with the id arrays or a scan of them per row: for a
-- chain 10,000 deep, whose every task waits on its child, those were planned
-- as one pass over the 10,000 pairs for every copied task (issue 38).
--
-- Run by Store.CopyHistory.
--
-- Locks: row locks on what it writes (inserts into tasks), held until the
-- transaction ends.
-- name: InsertForkTasks
WITH ids AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.old::text, x.new), '{}'::jsonb) AS m FROM unnest($2::bigint[], $3::bigint[]) x(old, new)),
evs AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.old::text, x.new), '{}'::jsonb) AS m FROM unnest($5::bigint[], $6::bigint[]) x(old, new))
INSERT INTO {schema}.tasks
    (id, conversation_id, owner_task_id, kind, status, background, input, phase, state, result, error,
     attempt, restart_limit, abandon_on_restart, abort_requested, wait_policy, wait_ids, wake_at, sleep_seq,
     max_retries, retries, idempotency_key, settle_seq, created_at, started_at, settled_at,
     retry_backoff_base, retry_backoff_cap, error_history, await_name, delivered, deadline, trace, forked_from,
     tenant, priority, queue_at, queue_expires_at, concurrency_key)
OVERRIDING SYSTEM VALUE
SELECT m.new, $1, ((SELECT m FROM ids)->>s.owner_task_id::text)::bigint, s.kind, s.status, s.background, s.input, s.phase, s.state, s.result, s.error,
    s.attempt, s.restart_limit, s.abandon_on_restart, s.abort_requested, s.wait_policy,
    CASE WHEN s.wait_ids IS NOT NULL THEN coalesce((SELECT array_agg(((SELECT m FROM ids)->>x.old::text)::bigint ORDER BY x.ord)
        FROM unnest(s.wait_ids) WITH ORDINALITY x(old, ord)
        WHERE (SELECT m FROM ids) ? x.old::text), '{}') END,
    s.wake_at, s.sleep_seq, s.max_retries, s.retries, s.idempotency_key, m.settle, s.created_at, s.started_at, s.settled_at,
    s.retry_backoff_base, s.retry_backoff_cap, s.error_history, s.await_name,
    CASE WHEN s.delivered ? 'event_id' THEN jsonb_set(s.delivered, '{event_id}',
        coalesce((SELECT m FROM evs)->(s.delivered->>'event_id'), 'null'::jsonb))
    ELSE s.delivered END,
    s.deadline, s.trace, s.id,
    s.tenant, s.priority, s.queue_at, s.queue_expires_at, s.concurrency_key
FROM unnest($2::bigint[], $3::bigint[], $4::bigint[]) m(old, new, settle)
CROSS JOIN LATERAL (SELECT * FROM {schema}.tasks WHERE id = m.old OFFSET 0) s
ORDER BY m.new;

-- Store.CopyHistory copies the settled history of conversation from through
-- turn through into conversation to (inserted already): tasks with new ids
-- (owners, waits and delivered events remapped), their events, and the log
-- up to the copied tasks' last entry.
--
-- Locks: row locks on what it writes (inserts into events), held until the
-- transaction ends.
-- name: InsertForkEvents
WITH ids AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.old::text, x.new), '{}'::jsonb) AS m FROM unnest($2::bigint[], $3::bigint[]) x(old, new))
INSERT INTO {schema}.events
    (id, conversation_id, task_id, name, payload, idempotency_key, queued, emitted_at, delivered_to, delivered_at)
OVERRIDING SYSTEM VALUE
SELECT ev.new, $1, ((SELECT m FROM ids)->>e.task_id::text)::bigint, e.name, e.payload, e.idempotency_key, e.queued, e.emitted_at,
    ((SELECT m FROM ids)->>e.delivered_to::text)::bigint,
    CASE WHEN (SELECT m FROM ids) ? e.delivered_to::text THEN e.delivered_at END
FROM unnest($5::bigint[], $6::bigint[]) ev(old, new)
CROSS JOIN LATERAL (SELECT * FROM {schema}.events WHERE id = ev.old OFFSET 0) e
WHERE $4::text IS NOT NULL
ORDER BY ev.new;

-- The log up to the last entry of the copied tasks: their entries and the
-- conversation's own, in order, with the copies' ids. $3, $4 the old and new
-- task ids, $5, $6 the old and new event ids, turned into each other as
-- InsertForkTasks does.
--
-- Run by Store.CopyHistory.
--
-- Locks: row locks on what it writes (inserts into conversation_log), held
-- until the transaction ends.
-- name: InsertForkLog
WITH ids AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.old::text, x.new), '{}'::jsonb) AS m
    FROM unnest($3::bigint[], $4::bigint[]) x(old, new)),
evs AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(x.old::text, x.new), '{}'::jsonb) AS m FROM unnest($5::bigint[], $6::bigint[]) x(old, new))
INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload, at)
SELECT $1, ((SELECT m FROM ids)->>l.task_id::text)::bigint, l.kind, l.status, l.name,
    CASE WHEN l.payload IS NULL OR jsonb_typeof(l.payload) <> 'object' THEN l.payload
    ELSE l.payload
        || CASE WHEN l.payload ? 'owner' THEN jsonb_build_object('owner',
            (SELECT m FROM ids)->(l.payload->>'owner')) ELSE '{}' END
        || CASE WHEN l.payload ? 'event_id' THEN jsonb_build_object('event_id',
            (SELECT m FROM evs)->(l.payload->>'event_id')) ELSE '{}' END
    END,
    l.at
FROM {schema}.conversation_log l
WHERE l.conversation_id = $2
  AND (l.task_id IS NULL OR (SELECT m FROM ids) ? l.task_id::text)
  AND l.seq <= (SELECT coalesce(max(c.seq), 0) FROM {schema}.conversation_log c
        WHERE c.conversation_id = $2 AND (SELECT m FROM ids) ? c.task_id::text)
ORDER BY l.seq;
