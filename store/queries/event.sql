-- The statements internal/store/event.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Events, awaits and the conversation log (the schema baseline).


-- EventByKey reads the event of a conversation with an idempotency key.
--
-- Locks: none (a read).
-- name: EventByKey
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events
    WHERE conversation_id = $1 AND idempotency_key = $2;

-- FirstWinsEvent reads the newest first-wins event of a name at an address
-- (task 0: the conversation): the decision a repeated emit returns.
--
-- Locks: none (a read).
-- name: FirstWinsEvent
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events
    WHERE conversation_id = $1 AND name = $2 AND coalesce(task_id, 0) = $3 AND NOT queued
    ORDER BY id DESC LIMIT 1;

-- InsertEvent inserts an undelivered event.
--
-- Locks: row locks on what it writes (inserts into events), held until the
-- transaction ends.
-- name: InsertEvent
INSERT INTO {schema}.events (conversation_id, task_id, name, payload, idempotency_key, queued)
    VALUES ($1, nullif($2::bigint, 0), $3, $4, nullif($5::text, ''), $6)
    RETURNING id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at;

-- The oldest undelivered event an await of $2 by task $3 takes: one
-- addressed to it first, then one addressed to the conversation.
--
-- UndeliveredFor locks the oldest undelivered event an await of name by
-- taskID takes.
--
-- Locks: FOR UPDATE on the rows it selects, held until the transaction ends.
-- name: UndeliveredFor
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events
    WHERE conversation_id = $1 AND name = $2 AND delivered_to IS NULL AND (task_id = $3 OR task_id IS NULL)
    ORDER BY (task_id IS NULL), id LIMIT 1 FOR UPDATE;

-- MarkDelivered records that event id woke task taskID.
--
-- Locks: row locks on what it writes (updates events), held until the
-- transaction ends.
-- name: MarkDelivered
UPDATE {schema}.events SET delivered_to = $2, delivered_at = greatest(now(), emitted_at)
WHERE id = $1 AND conversation_id = $3 AND delivered_to IS NULL;

-- The oldest task of the conversation awaiting $2 (for an event addressed to
-- the conversation).
--
-- OldestAwaiting locks the oldest task of conv awaiting name.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: OldestAwaiting
SELECT {task_columns} FROM {schema}.tasks
WHERE conversation_id = $1 AND status = 'sleeping' AND await_name = $2
ORDER BY id LIMIT 1 FOR NO KEY UPDATE;

-- AwaitTask parks a running task (to: sleeping) awaiting name, with a fresh
-- token, until wakeAt (nil: no timeout) with wake job jobID.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: AwaitTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, phase = $3, state = $4, await_name = $5, await_token = $6, wake_at = $7,
        wake_job_id = nullif($8::bigint, 0), sleep_seq = sleep_seq + 1, delivered = NULL,
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $9
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- DeliverTask wakes an awaiting task (to: pending) with what woke it.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: DeliverTask
WITH w AS (UPDATE {schema}.tasks t SET status = $2, delivered = $3, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $4
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- PendingAwaits lists the tasks of conv awaiting an event.
--
-- Locks: none (a read).
-- name: PendingAwaits
SELECT {task_columns} FROM {schema}.tasks
WHERE conversation_id = $1 AND status = 'sleeping' AND await_name IS NOT NULL ORDER BY id;

-- TaskByAwaitToken reads the task whose current (or last) await has token:
-- how a token of the form that does not name its task is found.
--
-- Locks: none (a read).
-- name: TaskByAwaitToken
SELECT {task_columns} FROM {schema}.tasks WHERE await_token = $1;

-- AppendLog appends an entry of kind (progress, event) to conv's log.
--
-- Locks: row locks on what it writes (inserts into conversation_log), held
-- until the transaction ends.
-- name: AppendLog
INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name, payload)
VALUES ($1, nullif($2::bigint, 0), $3, nullif($4::text, ''), $5) RETURNING seq;

-- ReadLog reads up to limit entries of conv's log after seq after.
--
-- Locks: none (a read).
-- name: ReadLog
SELECT seq, conversation_id, coalesce(task_id, 0), kind, coalesce(status, ''), coalesce(name, ''), payload, at
FROM {schema}.conversation_log WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3;

-- LogHead is the last seq of conv's log (0: none).
--
-- Locks: none (a read).
-- name: LogHead
SELECT coalesce(max(seq), 0) FROM {schema}.conversation_log WHERE conversation_id = $1;

-- PruneLog deletes up to limit log entries older than keep, oldest first,
-- and returns how many.
--
-- Locks: row locks on what it writes (deletes from conversation_log), held
-- until the transaction ends.
-- name: PruneLog
DELETE FROM {schema}.conversation_log WHERE seq IN (
    SELECT seq FROM {schema}.conversation_log WHERE at < now() - $1 * interval '1 microsecond' ORDER BY seq LIMIT $2);

-- UndeliveredEvents lists the undelivered events of conv.
--
-- Locks: none (a read).
-- name: UndeliveredEvents
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events
    WHERE conversation_id = $1 AND delivered_to IS NULL ORDER BY id;

-- ConversationEvents reads up to limit events of conv with ids after after,
-- in id order.
--
-- Locks: none (a read).
-- name: ConversationEvents
SELECT id, conversation_id, coalesce(task_id, 0), name, payload, coalesce(idempotency_key, ''), queued,
emitted_at, coalesce(delivered_to, 0), delivered_at FROM {schema}.events
    WHERE conversation_id = $1 AND id > $2 ORDER BY id LIMIT $3;

-- LiveDeadlines lists up to limit live tasks past their deadline.
--
-- Locks: none (a read).
-- name: LiveDeadlines
SELECT id FROM {schema}.tasks
WHERE deadline < now() AND status IN ({live}) ORDER BY deadline LIMIT $1;
