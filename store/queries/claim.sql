-- The statements internal/store/claim.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Starting tasks. Every start sets the same columns, under a lease the
-- caller fenced in the same transaction: a fresh fencing token, the lease
-- epoch the run starts under, started_at at the first start, and the task
-- lease's deadline by the database's clock.
--
-- In the SET list of every start, the status is the one fsm gave for the
-- start edge, run_epoch the fenced lease epoch, and the lease a number of
-- microseconds.


-- StartTask starts the pending task id of conversationID if it is not
-- abort-requested, expired in its queue, or held back by a full concurrency
-- limit (the trigger task_slots skips it then). ErrNoRows means the task was
-- not startable; the caller reads it to say why.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: StartTask
WITH w AS (UPDATE {schema}.tasks t SET status = $3, token = nextval('{schema}.task_token_seq'::regclass), run_epoch = $4,
        started_at = coalesce(started_at, now()),
        lease_expires_at = now() + $5 * interval '1 microsecond', updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $2 AND status = 'pending' AND NOT abort_requested
      AND (t.queue_expires_at IS NULL OR t.started_at IS NOT NULL OR t.queue_expires_at > now())
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- ClaimRunnable starts up to limit pending tasks of a conversation whose
-- kind is among kinds (nil: any), children and the roots listed in roots
-- only (nil: any root), in queue order (oldest first, less their
-- priority's aging), skipping locked rows, and those a full concurrency
-- limit holds back or expired in their queue.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, skipping rows another
-- transaction holds; row locks on what it writes (updates tasks; inserts
-- into conversation_log), held until the transaction ends.
-- name: ClaimRunnable
WITH w AS (WITH picked AS (
        SELECT t.id FROM {schema}.tasks t
        WHERE t.conversation_id = $1 AND t.status = 'pending' AND NOT t.abort_requested
          AND ($2::text[] IS NULL OR t.kind = ANY($2))
          AND (t.owner_task_id IS NOT NULL OR $3::bigint[] IS NULL OR t.id = ANY($3))
          AND {startable}
        ORDER BY t.queue_at, t.id LIMIT $4
        FOR NO KEY UPDATE OF t SKIP LOCKED)
    UPDATE {schema}.tasks t SET status = $5, token = nextval('{schema}.task_token_seq'::regclass), run_epoch = $6,
        started_at = coalesce(started_at, now()),
        lease_expires_at = now() + $7 * interval '1 microsecond', updated_at = now()
    WHERE t.id IN (SELECT id FROM picked) AND t.conversation_id = $1
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w ORDER BY id;

-- LiveRoots reads a conversation's live root tasks in id order.
--
-- Locks: none (a read).
-- name: LiveRoots
SELECT {task_columns} FROM {schema}.tasks
WHERE conversation_id = $1 AND owner_task_id IS NULL AND status IN ({live})
ORDER BY id;

-- TasksInStatus reads a conversation's tasks in one status, in id order.
--
-- Locks: none (a read).
-- name: TasksInStatus
SELECT {task_columns} FROM {schema}.tasks
WHERE conversation_id = $1 AND status = $2 ORDER BY id;

-- RunStates reads status and token of the tasks with the given ids.
--
-- Locks: none (a read).
-- name: RunStates
SELECT id, status, coalesce(token, 0) FROM {schema}.tasks WHERE id = ANY($1);

-- StaleUnknownKinds lists up to limit pending tasks that never ran, whose
-- kind is not among kinds, created longer than grace ago.
--
-- Locks: none (a read).
-- name: StaleUnknownKinds
SELECT id FROM {schema}.tasks
WHERE status = 'pending' AND started_at IS NULL AND NOT (kind = ANY($1))
  AND created_at < now() - $2 * interval '1 microsecond'
ORDER BY id LIMIT $3;

-- ClaimTasksUnfenced starts up to limit pending tasks of every conversation,
-- oldest first, without any lease. Only the benchmarks' engine-loop
-- reference line calls it: it measures the engine's operations without a
-- runner, and a runner never starts a task outside a lease.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, skipping rows another
-- transaction holds; row locks on what it writes (updates tasks; inserts
-- into conversation_log), held until the transaction ends.
-- name: ClaimTasksUnfenced
WITH w AS (WITH picked AS (
    SELECT id FROM {schema}.tasks
    WHERE status = 'pending' AND NOT abort_requested
    ORDER BY id LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED)
    UPDATE {schema}.tasks t SET status = $2, token = nextval('{schema}.task_token_seq'::regclass), run_epoch = 0,
        started_at = coalesce(started_at, now()),
        lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
    WHERE id IN (SELECT id FROM picked)
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w ORDER BY id;
