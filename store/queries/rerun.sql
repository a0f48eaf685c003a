-- The statements internal/store/rerun.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- A rerun (docs/design.md §3.17) is a new task that runs a failed, aborted
-- or cancelled one again from its checkpoint: the same conversation,
-- owner, kind, input and options, the source's phase and state, rerun_of
-- naming the source. Its deadline and queue time to live are the
-- source's spans, counted from the rerun's creation.


-- RerunTask inserts the rerun of task $1 of conversation $2 (locked, and
-- checked by the caller) and returns it.
--
-- Locks: row locks on what it writes (inserts into conversation_log,
-- tasks), held until the transaction ends.
-- name: RerunTask
WITH w AS (INSERT INTO {schema}.tasks AS t
    (conversation_id, owner_task_id, kind, background, input, phase, state, restart_limit, abandon_on_restart,
     max_retries, retry_backoff_base, retry_backoff_cap, deadline, trace,
     tenant, priority, queue_at, queue_expires_at, concurrency_key, rerun_of)
    SELECT s.conversation_id, s.owner_task_id, s.kind, s.background, s.input, s.phase, s.state, s.restart_limit,
           s.abandon_on_restart, s.max_retries, s.retry_backoff_base, s.retry_backoff_cap,
           now() + (s.deadline - s.created_at), s.trace,
           s.tenant, s.priority, now() - s.priority * interval '1 second', now() + (s.queue_expires_at - s.created_at),
           s.concurrency_key, s.id
    FROM {schema}.tasks s WHERE s.id = $1 AND s.conversation_id = $2
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- RerunOf returns the id of the rerun of task $1 of conversation $2.
-- ErrNoRows when it has none.
--
-- Locks: none (a read).
-- name: RerunOf
SELECT id FROM {schema}.tasks WHERE rerun_of = $1 AND conversation_id = $2;

-- RerunInWait puts rerun $3 in the place of task $2 in the wait of its
-- owner $1 of conversation $4, waiting (event rerun, waiting → waiting).
-- ErrNoRows when the owner does not wait on $2.
--
-- Locks: row locks on what it writes (updates tasks), held until the
-- transaction ends.
-- name: RerunInWait
UPDATE {schema}.tasks SET wait_ids = array_replace(wait_ids, $2::bigint, $3::bigint), updated_at = now()
WHERE id = $1 AND conversation_id = $4 AND status = 'waiting' AND $2::bigint = ANY(wait_ids)
RETURNING id;
