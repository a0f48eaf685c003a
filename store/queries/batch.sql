-- The statements internal/store/batch.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Set-based statements: one statement for many tasks or conversations, so
-- that a batch of operations costs a handful of round trips, not a handful
-- per task.


-- The conversations of a batch created (those that do not exist) and locked
-- (those that do), each announced at commit, in one statement. A row this
-- transaction inserts needs no lock: no other transaction can see it, nor
-- insert its id, before this one ends; locking it would cost a WAL record
-- per new conversation. An existing row is locked in id order. A
-- conversation another transaction created after this statement's snapshot
-- is neither (the insert skips it, the lock cannot see it):
-- EnsureLockConversations locks those in a statement of their own.
--
-- Taken by a runner's create (docs/design.md §3.18): a conversation marked
-- in take ($5) whose first task (of kind $6 at its index) the create may
-- start is inserted taken by the holder $4 at epoch 1 — if the holder's row
-- is live and no concurrency limit of that kind or of its tenant exists —
-- and not announced (the holder runs it; no other runner has anything to
-- do). One that exists is locked, as ever, never taken.
--
-- EnsureLockConversations creates the conversations among ids (sorted,
-- distinct) that do not exist and locks, in id order, those that do, and
-- announces each at commit but those it took; it returns the ids it
-- created or locked, all of ids unless a conversation is missing, with
-- their tenants and whether it took them. A conversation it creates gets
-- the tenant at its index in tenants.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects; row locks on what it
-- writes (inserts into conversations), held until the transaction ends.
-- name: EnsureLockConversations
WITH h AS (
    SELECT h.id, h.name FROM {schema}.holders h WHERE h.id = $4 AND h.expires_at > now() AND h.ended_by IS NULL),
ins AS (
    INSERT INTO {schema}.conversations (id, tenant, holder_id, holder, epoch)
    SELECT u.id, u.tenant, s.id, s.name, CASE WHEN s.id IS NULL THEN 0 ELSE 1 END
    FROM unnest($1::text[], $3::text[], $5::bool[], $6::text[]) AS u(id, tenant, take, kind)
    LEFT JOIN h s ON u.take AND NOT EXISTS (SELECT 1 FROM {schema}.concurrency_limits l WHERE l.key IN ('tenant:' || u.tenant, 'kind:' || u.kind))
    ON CONFLICT DO NOTHING RETURNING id, tenant, holder_id IS NOT NULL AS taken),
locked AS (
    SELECT c.id, c.tenant FROM {schema}.conversations c
    WHERE c.id = ANY($1) AND NOT c.id = ANY(ARRAY(SELECT id FROM ins))
    ORDER BY c.id FOR NO KEY UPDATE)
SELECT id, tenant, CASE WHEN NOT taken THEN pg_notify($2, id) END, taken
FROM (SELECT id, tenant, taken FROM ins UNION ALL SELECT id, tenant, false FROM locked) x;

-- Conversations locked in id order (docs/design.md §5), each announced at
-- commit like LockConversation does.
--
-- LockConversations locks the conversations among ids in id order and
-- returns the ids it locked (missing ones are left out), with their tenants.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: LockConversations
SELECT id, tenant, pg_notify($2, id) FROM {schema}.conversations
WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE;

-- TasksByKeys reads the tasks created with the given (conversation,
-- idempotency key) pairs, same index in convs and keys.
--
-- Locks: none (a read).
-- name: TasksByKeys
SELECT {task_columns} FROM {schema}.tasks t
JOIN unnest($1::text[], $2::text[]) AS k(conv, key) ON t.conversation_id = k.conv AND t.idempotency_key = k.key;

-- LockOwners locks the tasks among ids in id order and returns what a create
-- checks of them.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: LockOwners
SELECT id, conversation_id, status, abort_requested, coalesce(token, 0)
FROM {schema}.tasks WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE;

-- The ids are given in the order of the rows (the identity's default is
-- computed as the ordered rows are inserted), so that reading the written
-- rows back by id gives them in the order asked.
--
-- Each task's tenant is its conversation's, which the caller read (the
-- foreign key to the conversation's id and tenant refuses another).
--
-- InsertTasks creates pending tasks in one statement, in the order given,
-- and returns their ids and creation times in that order (ids grow in it).
--
-- Locks: row locks on what it writes (inserts into conversation_log, tasks),
-- held until the transaction ends.
-- name: InsertTasks
WITH w AS (INSERT INTO {schema}.tasks AS t
    (conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
     max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace,
     tenant, priority, queue_at, queue_expires_at, concurrency_key,
     status, token, run_epoch, started_at, lease_expires_at)
    SELECT v.conv, nullif(v.owner, 0), v.kind, v.bg, v.input::jsonb, v.rl, v.ab, v.mr, nullif(v.key, ''),
           v.base * interval '1 microsecond', v.cap * interval '1 microsecond', v.deadline, v.trace::jsonb,
           v.tenant, v.prio, now() - v.prio * interval '1 second',
           CASE WHEN v.ttl > 0 THEN now() + v.ttl * interval '1 microsecond' END, nullif(v.ckey, ''),
           CASE WHEN v.started THEN 'running' ELSE 'pending' END,
           CASE WHEN v.started THEN nextval('{schema}.task_token_seq'::regclass) END,
           CASE WHEN v.started THEN 1 END,
           CASE WHEN v.started THEN now() END,
           CASE WHEN v.started THEN now() + $19::bigint * interval '1 microsecond' END
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bool[], $5::text[], $6::int[], $7::bool[],
                $8::int[], $9::text[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::text[],
                $14::int[], $15::bigint[], $16::text[], $17::text[], $18::bool[])
         WITH ORDINALITY AS v(conv, owner, kind, bg, input, rl, ab, mr, key, base, cap, deadline, trace, prio, ttl, ckey, tenant, started, ord)
    ORDER BY v.ord
    RETURNING t.*),
logged AS ({log_status})
SELECT id, created_at, coalesce(token, 0), coalesce(run_epoch, 0), lease_expires_at FROM w ORDER BY id;
