-- The statements internal/store/task_write.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Every write here sets the status it is given: the engine computes it with
-- fsm.Transition first, and the database's guard trigger checks it again.
--
-- The conversation log's status entries are written by the statements that
-- change the tasks, in the same statement (issue 20): each statement that
-- inserts a task or changes a status is a data-modifying CTE, w, that
-- returns the rows it wrote whole, a second CTE that appends their entries,
-- and the statement's own result read from w: logged AS ({log_status}),
-- where {log_status} is the one INSERT of the log's status entries
-- (internal/store's logStatus), one entry per row of w, an abort's in the
-- order they settled and every other by id, naming the owner, the code and
-- message of a failed, aborted, cancelled or orphaned task, and what a
-- sleeping task awaits. Triggers over the
-- statement's transition tables would capture every task update's old and
-- new images (a checkpoint, a heartbeat, none of which is logged) and plan
-- a join of them afresh: a claim or a complete cost about twice the update
-- itself that way.
--
-- Every statement of store.SQL that writes tasks.status or inserts a task
-- has that shape (TestEveryStatusWriteIsLogged keeps it so), and the
-- invariant checker reports a task whose newest status entry is not its
-- status: a hand-written change, which no trigger logs any more, is found
-- there.
--
-- The CTE logged appends one status entry per row of w: an abort's settles
-- in the order they settled (leaves first), every other row by id. Its
-- payload names the owner, the error's code and message of a failed,
-- aborted, cancelled or orphaned task, and what a sleeping task awaits (the
-- payload the triggers wrote, so that readers of the log see no change).
-- Every row such a write returns changed its status or is new: the state
-- machine has no edge from a status to itself but the checkpoint's, which
-- is not logged and not written so.


-- InsertTask creates a pending task.
--
-- Locks: row locks on what it writes (inserts into conversation_log, tasks),
-- held until the transaction ends.
-- name: InsertTask
WITH w AS (INSERT INTO {schema}.tasks AS t
    (conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
     max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace,
     tenant, priority, queue_at, queue_expires_at, concurrency_key)
    VALUES ($1, nullif($2::bigint, 0), $3, $4, $5, $6, $7, $8, nullif($9::text, ''),
            $10 * interval '1 microsecond', $11 * interval '1 microsecond', $12, $13,
            (SELECT c.tenant FROM {schema}.conversations c WHERE c.id = $1), $14::int, now() - $14::int * interval '1 second',
            CASE WHEN $15::bigint > 0 THEN now() + $15::bigint * interval '1 microsecond' END, nullif($16::text, ''))
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- A root task created in one statement, and its conversation on first use:
-- the conversation row inserted (then no other transaction can lock it until
-- this one ends) or, when it exists, locked; the task inserted after it. (It
-- does not NOTIFY: the engine announces it after the commit, see core's
-- announce.go.) No row comes back when the conversation was created by a
-- transaction that committed after this statement's snapshot, or when the
-- idempotency key is taken, or the conversation exists with another tenant
-- than the one named ($17): the caller then takes the transaction path,
-- which handles all three.
--
-- Started by its create (docs/design.md §3.18): when $18 names a holder
-- (a runner of this process that has a worker free for the kind), the
-- holder's row is live, no concurrency limit could count the task (no key
-- of its own, no limit of its kind or tenant) and the conversation is new,
-- the conversation is inserted taken by that holder at epoch 1 and the task
-- inserted running at that epoch, with a token and a task lease of $19
-- microseconds: no notification, open or claim before its handler. Any
-- other case inserts it pending, as ever.
--
-- CreateRoot creates a root task (see CreateRoot), and its conversation on
-- first use, in one statement; ok is false, with nothing written, when the
-- caller must take the transaction path.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects; row locks on what it
-- writes (inserts into conversation_log, conversations, tasks), held until
-- the transaction ends.
-- name: CreateRoot
WITH h AS (
    SELECT h.id, h.name FROM {schema}.holders h
    WHERE h.id = $18 AND h.expires_at > now() AND h.ended_by IS NULL AND $16 = ''
      AND NOT EXISTS (SELECT 1 FROM {schema}.concurrency_limits l WHERE l.key IN ('tenant:' || $17, 'kind:' || $3))),
conv AS (
    INSERT INTO {schema}.conversations (id, tenant, holder_id, holder, epoch)
    SELECT $1, $17, h.id, h.name, CASE WHEN h.id IS NULL THEN 0 ELSE 1 END FROM (SELECT) x LEFT JOIN h ON true
    ON CONFLICT DO NOTHING RETURNING id, tenant, holder_id),
locked AS (
    SELECT id, tenant FROM {schema}.conversations WHERE id = $1 AND ($17 = '' OR tenant = $17) AND NOT EXISTS (SELECT 1 FROM conv) FOR NO KEY UPDATE),
ready AS (SELECT id, tenant, holder_id IS NOT NULL AS started FROM conv UNION ALL SELECT id, tenant, false FROM locked),
w AS (
    INSERT INTO {schema}.tasks AS t
    (conversation_id, owner_task_id, kind, background, input, restart_limit, abandon_on_restart,
     max_retries, idempotency_key, retry_backoff_base, retry_backoff_cap, deadline, trace,
     tenant, priority, queue_at, queue_expires_at, concurrency_key,
     status, token, run_epoch, started_at, lease_expires_at)
    SELECT ready.id, nullif($2::bigint, 0), $3, $4, $5, $6, $7, $8, nullif($9::text, ''),
           $10 * interval '1 microsecond', $11 * interval '1 microsecond', $12::timestamptz, $13::jsonb,
           ready.tenant, $14::int, now() - $14::int * interval '1 second',
           CASE WHEN $15::bigint > 0 THEN now() + $15::bigint * interval '1 microsecond' END, nullif($16::text, ''),
           CASE WHEN ready.started THEN 'running' ELSE 'pending' END,
           CASE WHEN ready.started THEN nextval('{schema}.task_token_seq'::regclass) END,
           CASE WHEN ready.started THEN 1 END,
           CASE WHEN ready.started THEN now() END,
           CASE WHEN ready.started THEN now() + $19::bigint * interval '1 microsecond' END
    FROM ready
    ON CONFLICT (conversation_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- Announce notifies channel of each conversation of convs, in one statement
-- committed on its own.
--
-- Locks: none (pg_notify queues a notification sent at commit).
-- name: Announce
SELECT pg_notify($1, c) FROM unnest($2::text[]) AS c;

-- CheckpointTask replaces phase and state of a running task held with token
-- and extends its lease. ErrNoRows means the write was fenced off.
--
-- Locks: row locks on what it writes (updates tasks), held until the
-- transaction ends.
-- name: CheckpointTask
UPDATE {schema}.tasks
SET phase = $3, state = $4, lease_expires_at = now() + $5 * interval '1 microsecond', updated_at = now()
WHERE id = $1 AND conversation_id = $6 AND token = $2 AND status = 'running' AND NOT abort_requested
RETURNING {task_columns};

-- HeartbeatTask extends the lease of a running task held with token.
-- ErrNoRows means the write was fenced off.
--
-- Locks: row locks on what it writes (updates tasks), held until the
-- transaction ends.
-- name: HeartbeatTask
UPDATE {schema}.tasks
SET lease_expires_at = now() + $3 * interval '1 microsecond', updated_at = now()
WHERE id = $1 AND conversation_id = $4 AND token = $2 AND status = 'running' AND NOT abort_requested
RETURNING {task_columns};

-- A progress entry of a running task held with token, in one statement that
-- commits on its own (Run.Progress): the conversation's row locked first, as
-- every writer of its log holds it until commit (so the log's order is its
-- commit order); then the task's row share-locked, which in READ COMMITTED
-- re-reads its newest version and checks the fence against that rather than
-- against the statement's snapshot, taken before the wait for the
-- conversation's lock (an abort or a take-over that committed meanwhile
-- fences the entry off). The uncorrelated EXISTS runs once before the task
-- is read, so the locks come in the engine's order. No row comes back when
-- it was fenced off.
--
-- AppendProgress appends a progress entry named name to the log of conv, for
-- a running task held with token (see AppendProgress). ErrNoRows means the
-- write was fenced off.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects; FOR SHARE on the rows it
-- selects (of t); row locks on what it writes (inserts into
-- conversation_log), held until the transaction ends.
-- name: AppendProgress
WITH c AS (
    SELECT id FROM {schema}.conversations WHERE id = $1 FOR NO KEY UPDATE),
t AS (
    SELECT t.id, t.conversation_id FROM {schema}.tasks t
    WHERE t.id = $2 AND t.conversation_id = $1 AND EXISTS (SELECT 1 FROM c)
      AND t.token = $3 AND t.status = 'running' AND NOT t.abort_requested
    FOR SHARE OF t)
INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, name, payload)
SELECT t.conversation_id, t.id, 'progress', nullif($4::text, ''), $5 FROM t RETURNING seq;

-- SettleTask moves a task to the settled status `to`, recording result and
-- error when they are not nil, and gives it the next settle sequence number.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: SettleTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, result = coalesce($3, result), error = coalesce($4, error),
        settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $5
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- A failure settles with its error in the error history, in the same
-- statement: a settled row can never be written again.
--
-- SettleFailedTask settles a task as failed (`to`) with taskErr as its
-- error, appended to its error history (the newest historyLimit entries
-- kept), in one statement.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: SettleFailedTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, error = $3,
        settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now(),
        error_history = (
    SELECT coalesce(jsonb_agg(h.e ORDER BY h.n), '[]'::jsonb) FROM (
        SELECT e, n FROM jsonb_array_elements(error_history || jsonb_build_array(
            $4::jsonb || jsonb_build_object('try', retries + 1, 'at', now())))
            WITH ORDINALITY AS a(e, n)
        ORDER BY n DESC LIMIT $5) h)
    WHERE t.id = $1 AND t.conversation_id = $6
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- HoldTask moves a running task to `to` (completing), holding its result.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: HoldTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, result = $3, token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $4
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- WaitTask parks a running task on its children with the given policy,
-- saving phase and state.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: WaitTask
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, phase = $3, state = $4, wait_policy = $5, wait_ids = $6,
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $7
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- WakeTask moves a waiting or sleeping task to `to` (pending). Its last wait
-- (policy and ids) and wake time stay recorded.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: WakeTask
WITH w AS (UPDATE {schema}.tasks t SET status = $2, updated_at = now()
    WHERE t.id = $1 AND t.conversation_id = $3
    RETURNING t.*),
logged AS ({log_status})
SELECT {task_columns} FROM w;

-- RecoverTasks puts the running tasks among ids back to `to` (pending), with
-- attempt + 1 when counted, in one statement, and returns the ids it moved.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: RecoverTasks
WITH w AS (UPDATE {schema}.tasks t
    SET status = $2, attempt = attempt + CASE WHEN $3 THEN 1 ELSE 0 END,
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE id = ANY($1) AND status = 'running'
    RETURNING t.*),
logged AS ({log_status})
SELECT id FROM w ORDER BY id;
