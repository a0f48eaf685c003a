-- The statements internal/store/sleep.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Sleep, wake and retry queries (docs/design.md §3.5, §3.7), and the few
-- reads and deletes of River's job table (river_job, migrated into the same
-- schema) that keep a sleeping task and its wake job in step. River's own
-- API inserts and completes those jobs; the engine deletes them with one
-- statement of its own, for any number of tasks at once and skipping the
-- rows River's scheduler holds (see DeleteWakeJobs).
--
-- An error_history update appends the entry (code, message, non_retryable)
-- stamped with the run number and the database time to error_history,
-- keeping the newest entries (as many as a parameter says) in order.


-- A sleep is sleep number sleep_seq + 1; its wake job ($6) is inserted
-- first, for that number, so that the task is written once.
--
-- SleepTask parks a running task until wakeAt with phase and state saved, as
-- sleep number sleep_seq + 1, whose wake job is jobID.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: SleepTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, phase = $3, state = $4, wake_at = $5, sleep_seq = sleep_seq + 1,
        wake_job_id = $6, token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
        await_name = NULL, await_token = NULL, delivered = NULL
    WHERE t.id = $1 AND t.conversation_id = $7
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- RetryTask parks a running task that failed until wakeAt, recording taskErr
-- as its error and in its error history (newest historyLimit entries kept),
-- with retries + 1 and sleep number sleep_seq + 1, whose wake job is jobID.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: RetryTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, error = $3, retries = retries + 1,
        wake_at = $4, sleep_seq = sleep_seq + 1,
        wake_job_id = $7, token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
        await_name = NULL, await_token = NULL, delivered = NULL,
        error_history = (
    SELECT coalesce(jsonb_agg(h.e ORDER BY h.n), '[]'::jsonb) FROM (
        SELECT e, n FROM jsonb_array_elements(error_history || jsonb_build_array(
            $5::jsonb || jsonb_build_object('try', retries + 1, 'at', now())))
            WITH ORDINALITY AS a(e, n)
        ORDER BY n DESC LIMIT $6) h)
    WHERE t.id = $1 AND t.conversation_id = $8
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- NotifySleep announces a new sleep on SleepChannel; the notification is
-- delivered when the transaction commits, and not at all if it rolls back.
--
-- Locks: none (pg_notify queues a notification sent at commit).
-- name: NotifySleep
SELECT pg_notify($1, $2);

-- DueNow reports whether at has come by the database's clock, and that
-- clock.
--
-- Locks: none (a read).
-- name: DueNow
SELECT $1::timestamptz <= clock_timestamp(), clock_timestamp();

-- DeleteWakeJobs deletes the wake jobs among jobIDs that are not running and
-- that no other transaction holds. A job left out is one River is moving at
-- that moment: its scheduler making it available, or a producer fetching it
-- to run. Waiting for it would stall every wake behind River's scheduler
-- (whose transaction locks all the jobs due in the next 5 s, for hundreds of
-- milliseconds under load); left alone, it runs, finds its sleep over and
-- does nothing.
--
-- Locks: FOR UPDATE on the rows it selects, skipping rows another
-- transaction holds; row locks on what it writes (deletes from river_job),
-- held until the transaction ends.
-- name: DeleteWakeJobs
DELETE FROM {schema}.river_job WHERE id IN (
    SELECT id FROM {schema}.river_job
    WHERE id = ANY($1) AND kind = 'arbor_wake' AND state <> 'running'
    FOR UPDATE SKIP LOCKED);

-- SleepingDue lists sleeping tasks of every conversation whose wake time is
-- at or before until, soonest first, at most limit of them.
--
-- Locks: none (a read).
-- name: SleepingDue
SELECT id, conversation_id, sleep_seq, wake_at FROM {schema}.tasks
WHERE status = 'sleeping' AND wake_at <= $1
ORDER BY wake_at, id LIMIT $2;

-- DatabaseNow returns the database's clock.
--
-- Locks: none (a read).
-- name: DatabaseNow
SELECT clock_timestamp();

-- TransactionNow returns the database's clock at the start of db's
-- transaction: the now() its statements write.
--
-- Locks: none (a read).
-- name: TransactionNow
SELECT now();

-- LiveWakeJobs lists the wake jobs of a conversation that River has not
-- finalized (not completed, cancelled or discarded), in id order.
--
-- Locks: none (a read).
-- name: LiveWakeJobs
SELECT id, state::text, coalesce((args->>'task_id')::bigint, 0),
    coalesce((args->>'sleep_seq')::bigint, 0)
FROM {schema}.river_job
WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('conversation_id', $1::text)
  AND state NOT IN ('completed', 'cancelled', 'discarded')
ORDER BY id;
