-- The statements internal/store/node_flush.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- The completer's flush: the set-based statements that apply a batch of
-- runs' outcomes at once (internal/core's flush.go).


-- A flush's conversations, locked in id order, skipping those another
-- transaction holds (their outcomes go in a later flush: a conversation
-- locked elsewhere delays only its own); held says whether this node still
-- holds each (the flush claims only in those).
--
-- LockForFlush locks the conversations in id order, skipping those another
-- transaction holds (missing from held), and says which holder row holder
-- still holds; xact is the transaction's id (0 when it locked none).
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, skipping rows another
-- transaction holds, held until the transaction ends.
-- name: LockForFlush
SELECT id, coalesce(holder_id = $2, false), pg_current_xact_id()::text::bigint FROM {schema}.conversations
WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;

-- Completions that need nothing else: running under the run's token, not
-- being aborted, with no live foreground child. The others are applied one
-- by one. The statements of a flush that take tasks by id test the status
-- with IS NOT DISTINCT FROM, which no index serves, so that statistics over
-- a settled history (none running, waiting or completing) cannot plan a scan
-- of a live-status index per row instead of the primary key
-- (TestFlushKeepsItsPlansAfterASettledHistory).
--
-- CompleteMany settles as `to` (completed) the running tasks among ids held
-- with the token at the same index, not being aborted and with no live
-- foreground child, recording the result at the same index; it returns those
-- it settled.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: CompleteMany
WITH w AS (WITH v AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS v(id, token, result))
    UPDATE {schema}.tasks t
    SET status = $4, result = v.result::jsonb,
        settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass),
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    FROM v
    WHERE t.id = v.id AND t.token = v.token AND t.status IS NOT DISTINCT FROM 'running' AND NOT t.abort_requested
      AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = t.id AND NOT c.background AND c.status IN ({live}))
    RETURNING t.*),
logged AS ({log_status})
SELECT id, coalesce(owner_task_id, 0) FROM w;

-- Owners whose waits the settles satisfied: no waited child is live. (A
-- fail_fast wait tripped by a child that did not complete is applied by that
-- child's own settle, one by one.)
--
-- WakeSatisfied wakes (`to`, pending) the waiting tasks among ids whose
-- waited children are all settled, and returns them.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: WakeSatisfied
WITH w AS (UPDATE {schema}.tasks o SET status = $2, updated_at = now()
    WHERE o.id = ANY($1) AND o.status IS NOT DISTINCT FROM 'waiting'
      AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = o.id AND c.id = ANY(o.wait_ids) AND c.status IN ({live}))
    RETURNING o.*),
logged AS ({log_status})
SELECT id FROM w;

-- Completing owners whose last live foreground child settled.
--
-- CompleteHeld completes (`to`) the completing tasks among ids with no live
-- foreground child, and returns them.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: CompleteHeld
WITH w AS (UPDATE {schema}.tasks o
    SET status = $2, settled_at = now(), settle_seq = nextval('{schema}.task_settle_seq'::regclass), updated_at = now()
    WHERE o.id = ANY($1) AND o.status IS NOT DISTINCT FROM 'completing'
      AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = o.id AND NOT c.background AND c.status IN ({live}))
    RETURNING o.*),
logged AS ({log_status})
SELECT id, coalesce(owner_task_id, 0) FROM w;

-- The tasks of a batch's waits, locked, with what a wait checks.
--
-- LockRunStates locks the tasks among ids in id order and reads what a
-- fenced write checks of them.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, skipping rows another
-- transaction holds, held until the transaction ends.
-- name: LockRunStates
SELECT id, status, coalesce(token, 0), abort_requested FROM {schema}.tasks
WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;

-- ChildStates reads the tasks among ids (missing ones are left out).
--
-- Locks: none (a read).
-- name: ChildStates
SELECT id, coalesce(owner_task_id, 0), status, coalesce(settle_seq, 0) FROM {schema}.tasks
WHERE id = ANY($1);

-- Waits parked together: running → waiting with phase, state, policy and ids
-- (as text, one array per row).
--
-- WaitMany parks running tasks on their children (`to`, waiting) in one
-- statement; the caller has locked and checked them.
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: WaitMany
WITH w AS (UPDATE {schema}.tasks t
    SET status = $6, phase = v.phase, state = v.state::jsonb, wait_policy = v.policy, wait_ids = v.ids::bigint[],
        token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS v(id, phase, state, policy, ids)
    WHERE t.id = v.id
    RETURNING t.*),
logged AS ({log_status})
SELECT count(*) FROM w;

-- WakeMany moves the tasks among ids (waiting, just parked) to `to`
-- (pending).
--
-- Locks: row locks on what it writes (updates tasks; inserts into
-- conversation_log), held until the transaction ends.
-- name: WakeMany
WITH w AS (UPDATE {schema}.tasks t SET status = $2, updated_at = now() WHERE id = ANY($1)
    RETURNING t.*),
logged AS ({log_status})
SELECT count(*) FROM w;
