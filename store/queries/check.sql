-- The statements internal/store/check.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).


-- ConversationIDs lists every conversation, in id order.
--
-- Locks: none (a read).
-- name: ConversationIDs
SELECT id FROM {schema}.conversations ORDER BY id;

-- Store.DuplicateTokens lists fencing tokens held by more than one task of a
-- conversation (there must be none).
--
-- Locks: none (a read).
-- name: DuplicateLiveTokens
SELECT token FROM {schema}.tasks
WHERE conversation_id = $1 AND token IS NOT NULL GROUP BY token HAVING count(*) > 1;

-- The conversation's holder as its row names it, the holders row it points
-- at with its deadline, and the database's clock.
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: CheckHolder
SELECT coalesce(c.holder, ''), coalesce(c.holder_id, 0), h.name, h.expires_at, statement_timestamp(), c.created_at
FROM {schema}.conversations c LEFT JOIN {schema}.holders h ON h.id = c.holder_id
WHERE c.id = $1;

-- Tasks whose delivered is not what an await's wake writes: nothing, a bare
-- timeout, or an event of the conversation delivered to the task, with its
-- payload as emitted (fsm's deliveredRule, read).
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: ForgedDeliveries
SELECT t.id FROM {schema}.tasks t
WHERE t.conversation_id = $1 AND t.delivered IS NOT NULL
  AND NOT ((coalesce(t.delivered->>'timed_out', '') = 'true' AND NOT (t.delivered ? 'event_id') AND NOT (t.delivered ? 'payload'))
    OR CASE WHEN t.delivered->>'event_id' ~ '^[0-9]{1,18}$' THEN EXISTS (SELECT 1 FROM {schema}.events ev
        WHERE ev.conversation_id = t.conversation_id AND ev.id = (t.delivered->>'event_id')::bigint
          AND ev.delivered_to = t.id AND ev.payload IS NOT DISTINCT FROM t.delivered->'payload') ELSE false END)
ORDER BY t.id;

-- Live tasks that claim to be a fork's copies (a fork copies settled tasks
-- only).
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: LiveForks
SELECT id FROM {schema}.tasks
WHERE conversation_id = $1 AND forked_from IS NOT NULL AND status IN ({live}) ORDER BY id;

-- Store.CheckRecords reads the conversation's Records (in the caller's
-- snapshot); slack is how far past the database's clock a log entry's time
-- may be, and kept how old a task may be for the log to keep all of its
-- entries (the log's retention before the database's clock).
--
-- Locks: none (a read).
-- name: AllEvents
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events WHERE conversation_id = $1 ORDER BY id;

-- Per task the log names: its newest status entry, and the names it was
-- logged parked awaiting.
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: LogByTask
SELECT task_id,
    coalesce((array_agg(status ORDER BY seq DESC) FILTER (WHERE kind = 'status'))[1], ''),
    coalesce(array_agg(DISTINCT payload->>'await') FILTER (WHERE kind = 'status' AND status = 'sleeping' AND payload ? 'await'), '{}')
FROM {schema}.conversation_log WHERE conversation_id = $1 AND task_id IS NOT NULL
GROUP BY task_id ORDER BY task_id;

-- Rows that name a conversation that does not exist (a foreign key the
-- triggers' being off let through; the log has none), by table and
-- conversation.
--
-- OrphanRows lists the rows of arbor's tables whose conversation does not
-- exist, grouped by table and conversation, at most limit groups.
--
-- Locks: none (a read).
-- name: OrphanRows
SELECT tbl, conversation_id, n FROM (
    SELECT 'tasks' AS tbl, conversation_id, count(*) AS n FROM {schema}.tasks GROUP BY conversation_id
    UNION ALL SELECT 'events', conversation_id, count(*) FROM {schema}.events GROUP BY conversation_id
    UNION ALL SELECT 'conversation_log', conversation_id, count(*) FROM {schema}.conversation_log GROUP BY conversation_id
    UNION ALL SELECT 'budgets', conversation_id, count(*) FROM {schema}.budgets GROUP BY conversation_id
    UNION ALL SELECT 'budget_reservations', conversation_id, count(*) FROM {schema}.budget_reservations GROUP BY conversation_id) r
WHERE NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.id = r.conversation_id)
ORDER BY conversation_id, tbl LIMIT $1;

-- Log entries stamped more than $2 microseconds after the database's clock
-- (the first ten).
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: FutureLog
SELECT seq FROM {schema}.conversation_log
WHERE conversation_id = $1 AND at > statement_timestamp() + $2 * interval '1 microsecond' ORDER BY seq LIMIT 10;

-- Event entries of the log that no emit wrote (the first ten): one without
-- the event's id (every emit's entry names it); one whose id names no event
-- of the conversation that matches it in name, task and payload, when an
-- event with that id exists (in the conversation but differing, or in
-- another conversation: a fork maps the ids it copies and writes null for
-- the others) or the id was never given out (past the events' sequence, read
-- only where the checker's role may read it). An id given out whose event is
-- gone is not reported: the prune deletes an event with the turn it was
-- delivered to, and may keep its entry (one addressed to no task). A fork's
-- copy of an entry whose event it did not copy names none (null), which is
-- not reported either.
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: ForgedLogEvents
WITH seq AS (SELECT pg_get_serial_sequence('{schema}.events', 'id')::regclass AS s),
    issued AS (SELECT CASE WHEN has_sequence_privilege(s, 'SELECT,USAGE') THEN pg_sequence_last_value(s) END AS last FROM seq)
SELECT l.seq FROM {schema}.conversation_log l
WHERE l.conversation_id = $1 AND l.kind = 'event'
  AND CASE WHEN l.payload IS NULL OR jsonb_typeof(l.payload) <> 'object' OR NOT l.payload ? 'event_id' THEN true
    WHEN l.payload->>'event_id' ~ '^[0-9]{1,18}$' THEN NOT EXISTS (SELECT 1 FROM {schema}.events ev
        WHERE ev.conversation_id = $1 AND ev.id = (l.payload->>'event_id')::bigint
          AND ev.name IS NOT DISTINCT FROM l.name
          AND (ev.task_id IS NOT DISTINCT FROM l.task_id OR l.task_id IS NULL)
          AND coalesce(ev.payload, 'null'::jsonb) = coalesce(l.payload->'payload', 'null'::jsonb))
      AND (EXISTS (SELECT 1 FROM {schema}.events ev WHERE ev.id = (l.payload->>'event_id')::bigint)
        OR (l.payload->>'event_id')::bigint > (SELECT coalesce(last, 0) FROM issued)
           AND (SELECT last FROM issued) IS NOT NULL)
    ELSE false END
ORDER BY l.seq LIMIT 10;

-- Progress entries of the log that no run wrote (the first ten): one naming
-- no task, or one of a task created at or after $2 (the log's retention
-- keeps every entry of those) whose newest status entry before it is not
-- running — Run.Progress writes only while its task runs, and a fork copies
-- a task's status entries with its progress.
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: ForgedProgress
SELECT l.seq FROM {schema}.conversation_log l
LEFT JOIN {schema}.tasks t ON t.conversation_id = $1 AND t.id = l.task_id
WHERE l.conversation_id = $1 AND l.kind = 'progress'
  AND (l.task_id IS NULL
    OR (t.created_at >= $2 AND (SELECT s.status FROM {schema}.conversation_log s
        WHERE s.conversation_id = $1 AND s.task_id = l.task_id AND s.kind = 'status' AND s.seq < l.seq
        ORDER BY s.seq DESC LIMIT 1) IS DISTINCT FROM 'running'))
ORDER BY l.seq LIMIT 10;

-- The events the log says were emitted.
--
-- Run by Store.CheckRecords.
--
-- Locks: none (a read).
-- name: LoggedEvents
SELECT DISTINCT (payload->>'event_id')::bigint FROM {schema}.conversation_log
WHERE conversation_id = $1 AND kind = 'event' AND payload->>'event_id' ~ '^[0-9]{1,18}$';

-- Invariant 10 for tenant budgets (migration 004): each budget with the
-- sum of the open reservations that charged it (its reserved, exactly),
-- and of the closed ones its spend still counts — all of them without a
-- window, those closed in its current window with one (its spent is at
-- least that: the prune deletes reservations, not their spend).
--
-- CheckTenantBudgets reads up to $1 tenant budgets with those sums.
--
-- Locks: none (a read).
-- name: CheckTenantBudgets
SELECT b.id, b.tenant, b.counter, b.window_unit, b.spent, b.reserved,
    coalesce((SELECT sum(r.amount) FROM {schema}.budget_reservations r
        WHERE r.actual IS NULL AND b.id = ANY (r.tenant_budgets)), 0),
    coalesce((SELECT sum(r.actual) FROM {schema}.budget_reservations r
        WHERE r.actual IS NOT NULL AND b.id = ANY (r.tenant_budgets)
          AND (b.window_unit = '' OR r.closed_at >= b.window_start)), 0)
FROM {schema}.tenant_budgets b ORDER BY b.id LIMIT $1;
