-- The statements internal/store/retention.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Retention: the prune's statements (docs/operations.md, "Retention").
--
-- The prune deletes settled turns (a root task with its whole subtree) and
-- whole conversations. Its transactions are marked (MarkPrune), without
-- which the guards refuse every delete of a task, a conversation or a row of
-- theirs; the guard also checks every deleted task semantically
-- (guardrules.DeleteRules), whatever the statement that deletes it.


-- What a pruned task or conversation takes with it (internal/store's
-- dependents, in this order): for each dependent table, Delete…OfTasks and
-- Count…OfTasks select the rows of tasks $2 (bigint[]) of conversation $1,
-- Delete…OfConversation and Count…OfConversation a batch of at most $2 of
-- every row of conversation $1. A prune that only counts (a dry run) runs
-- the Count… statements. The deletes of a conversation's rows use
-- = ANY(ARRAY(…)): the batch's keys looked up one by one (an index, or a
-- TID scan for ctid), never a scan of the table.
--
-- A pruned task's budgets go with it; its reservations too, their spend
-- carried first into the conversation's budgets (a session's spend outlives
-- its pruned turns; an open one is spent in full, its run long over).
-- Wake jobs are found through River's GIN index on args, one task at a
-- time; a running one (its worker holds it) is left to River.

-- Carries the spend of pruned tasks' reservations into their
-- conversation's budgets, before the reservations are deleted.
--
-- Locks: row locks on what it writes (updates budgets), held until the
-- transaction ends.
-- name: CarryBudgetReservationsBeforeTasks
UPDATE {schema}.budgets b
SET carried = b.carried + s.gone, spent = b.spent + s.open, reserved = b.reserved - s.open, updated_at = now()
FROM (SELECT counter, sum(coalesce(actual, amount)) AS gone, coalesce(sum(amount) FILTER (WHERE actual IS NULL), 0) AS open
    FROM {schema}.budget_reservations WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]) GROUP BY counter) s
WHERE b.conversation_id = $1 AND b.task_id IS NULL AND b.counter = s.counter;

-- Deletes the budgets of pruned tasks.
--
-- Locks: row locks on what it writes (deletes from budgets), held until the
-- transaction ends.
-- name: DeleteBudgetsOfTasks
DELETE FROM {schema}.budgets WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Counts the budgets of pruned tasks.
--
-- Locks: none (a read).
-- name: CountBudgetsOfTasks
SELECT count(*) FROM {schema}.budgets WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Deletes a batch of the budgets of a pruned conversation.
--
-- Locks: row locks on what it writes (deletes from budgets), held until the
-- transaction ends.
-- name: DeleteBudgetsOfConversation
DELETE FROM {schema}.budgets WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {schema}.budgets WHERE conversation_id = $1 LIMIT $2));

-- Counts the budgets of a pruned conversation.
--
-- Locks: none (a read).
-- name: CountBudgetsOfConversation
SELECT count(*) FROM {schema}.budgets WHERE conversation_id = $1 AND $2::int IS NOT NULL;

-- Deletes the budget reservations of pruned tasks.
--
-- Locks: row locks on what it writes (deletes from budget_reservations),
-- held until the transaction ends.
-- name: DeleteBudgetReservationsOfTasks
DELETE FROM {schema}.budget_reservations WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Counts the budget reservations of pruned tasks.
--
-- Locks: none (a read).
-- name: CountBudgetReservationsOfTasks
SELECT count(*) FROM {schema}.budget_reservations WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Deletes a batch of the budget reservations of a pruned conversation.
--
-- Locks: row locks on what it writes (deletes from budget_reservations),
-- held until the transaction ends.
-- name: DeleteBudgetReservationsOfConversation
DELETE FROM {schema}.budget_reservations WHERE id = ANY(ARRAY(
        SELECT id FROM {schema}.budget_reservations WHERE conversation_id = $1 LIMIT $2));

-- Counts the budget reservations of a pruned conversation.
--
-- Locks: none (a read).
-- name: CountBudgetReservationsOfConversation
SELECT count(*) FROM {schema}.budget_reservations WHERE conversation_id = $1 AND $2::int IS NOT NULL;

-- Deletes the events of pruned tasks.
--
-- Locks: row locks on what it writes (deletes from events), held until the
-- transaction ends.
-- name: DeleteEventsOfTasks
DELETE FROM {schema}.events WHERE conversation_id = $1 AND (task_id = ANY($2::bigint[]) OR delivered_to = ANY($2::bigint[]));

-- Counts the events of pruned tasks.
--
-- Locks: none (a read).
-- name: CountEventsOfTasks
SELECT count(*) FROM {schema}.events WHERE conversation_id = $1 AND (task_id = ANY($2::bigint[]) OR delivered_to = ANY($2::bigint[]));

-- Deletes a batch of the events of a pruned conversation.
--
-- Locks: row locks on what it writes (deletes from events), held until the
-- transaction ends.
-- name: DeleteEventsOfConversation
DELETE FROM {schema}.events WHERE id = ANY(ARRAY(
        SELECT id FROM {schema}.events WHERE conversation_id = $1 LIMIT $2));

-- Counts the events of a pruned conversation.
--
-- Locks: none (a read).
-- name: CountEventsOfConversation
SELECT count(*) FROM {schema}.events WHERE conversation_id = $1 AND $2::int IS NOT NULL;

-- Deletes the log entries of pruned tasks.
--
-- Locks: row locks on what it writes (deletes from conversation_log), held
-- until the transaction ends.
-- name: DeleteLogEntriesOfTasks
DELETE FROM {schema}.conversation_log WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Counts the log entries of pruned tasks.
--
-- Locks: none (a read).
-- name: CountLogEntriesOfTasks
SELECT count(*) FROM {schema}.conversation_log WHERE conversation_id = $1 AND task_id = ANY($2::bigint[]);

-- Deletes a batch of the log entries of a pruned conversation.
--
-- Locks: row locks on what it writes (deletes from conversation_log), held
-- until the transaction ends.
-- name: DeleteLogEntriesOfConversation
DELETE FROM {schema}.conversation_log WHERE seq = ANY(ARRAY(
        SELECT seq FROM {schema}.conversation_log WHERE conversation_id = $1 LIMIT $2));

-- Counts the log entries of a pruned conversation.
--
-- Locks: none (a read).
-- name: CountLogEntriesOfConversation
SELECT count(*) FROM {schema}.conversation_log WHERE conversation_id = $1 AND $2::int IS NOT NULL;

-- Deletes the wake jobs of pruned tasks.
--
-- Locks: row locks on what it writes (deletes from river_job), held until
-- the transaction ends.
-- name: DeleteWakeJobsOfTasks
DELETE FROM {schema}.river_job WHERE id IN (SELECT j.id FROM unnest($2::bigint[]) t(id) CROSS JOIN LATERAL (
        SELECT id FROM {schema}.river_job WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('task_id', t.id)
  AND state <> 'running' AND $1::text IS NOT NULL) j);

-- Counts the wake jobs of pruned tasks.
--
-- Locks: none (a read).
-- name: CountWakeJobsOfTasks
SELECT count(*) FROM {schema}.river_job WHERE id IN (SELECT j.id FROM unnest($2::bigint[]) t(id) CROSS JOIN LATERAL (
        SELECT id FROM {schema}.river_job WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('task_id', t.id)
  AND state <> 'running' AND $1::text IS NOT NULL) j);

-- Deletes a batch of the wake jobs of a pruned conversation.
--
-- Locks: row locks on what it writes (deletes from river_job), held until
-- the transaction ends.
-- name: DeleteWakeJobsOfConversation
DELETE FROM {schema}.river_job WHERE id = ANY(ARRAY(
        SELECT id FROM {schema}.river_job WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('conversation_id', $1::text) AND state <> 'running' LIMIT $2));

-- Counts the wake jobs of a pruned conversation.
--
-- Locks: none (a read).
-- name: CountWakeJobsOfConversation
SELECT count(*) FROM {schema}.river_job WHERE kind = 'arbor_wake' AND args @> jsonb_build_object('conversation_id', $1::text) AND state <> 'running' AND $2::int IS NOT NULL;

-- The prune's own River jobs, finished longer than $1 ago.
--
-- PruneFinishedPruneJobs deletes the prune's own River jobs finished longer
-- than keep ago, and returns how many.
--
-- Locks: row locks on what it writes (deletes from river_job), held until
-- the transaction ends.
-- name: PruneFinishedPruneJobs
DELETE FROM {schema}.river_job
WHERE kind = 'arbor_prune' AND finalized_at < now() - $1 * interval '1 microsecond';

-- The prune's mark (the schema baseline): the transaction's id in prune_marks,
-- which only the prune's role may write; removed before the transaction
-- commits.
--
-- MarkPrune marks tx as the prune's: the guard lets it delete what the
-- delete rules allow. The mark is a row of prune_marks, which only the
-- prune's role may write (migrations/sql/001_baseline.up.sql); a role
-- without that grant gets ErrPermissionDenied's 42501 here. UnmarkPrune
-- removes it before tx commits.
--
-- Locks: row locks on what it writes (inserts into prune_marks), held until
-- the transaction ends.
-- name: MarkPrune
INSERT INTO {schema}.prune_marks DEFAULT VALUES ON CONFLICT DO NOTHING;

-- UnmarkPrune removes tx's mark (MarkPrune), so that prune_marks holds only
-- the marks of transactions still running.
--
-- Locks: row locks on what it writes (deletes from prune_marks), held until
-- the transaction ends.
-- name: UnmarkPrune
DELETE FROM {schema}.prune_marks WHERE txid = pg_current_xact_id();

-- PruneCutoff returns now() minus olderThan, by the database's clock.
--
-- Locks: none (a read).
-- name: PruneCutoff
SELECT now() - $1 * interval '1 microsecond';

-- Settled turns settled before $1, after the cursor ($2, $3), oldest first,
-- across conversations (tasks_settled_roots_idx).
--
-- PruneCandidates returns up to limit settled turns settled before cutoff,
-- after (afterAt, afterID), oldest first.
--
-- Locks: none (a read).
-- name: PruneCandidates
SELECT conversation_id, settled_at, id FROM {schema}.tasks
WHERE owner_task_id IS NULL AND settled_at IS NOT NULL AND settled_at < $1
  AND (settled_at, id) > ($2, $3)
ORDER BY settled_at, id LIMIT $4;

-- Conversations created before $1 with no task left (after the cursor $2, in
-- id order): what a prune that deleted a conversation's tasks but not the
-- conversation (a holder still had its lease) left, and conversations that
-- never had a task.
--
-- EmptyConversations returns up to limit conversations created before cutoff
-- that have no task, with ids after afterID, in id order.
--
-- Locks: none (a read).
-- name: EmptyConversations
SELECT c.id FROM {schema}.conversations c
WHERE c.created_at < $1 AND c.id > $2
  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = c.id)
ORDER BY c.id LIMIT $3;

-- The conversation, locked for a prune's batch: skipped (no row) while
-- another transaction holds it. held says a live holder has its lease.
--
-- LockConversationForPrune locks conv for a prune's batch, skipping it (ok
-- false) when another transaction holds it or it does not exist; held says a
-- live holder has its lease.
--
-- Locks: FOR UPDATE on the rows it selects (of c), skipping rows another
-- transaction holds, held until the transaction ends.
-- name: LockConversationForPrune
SELECT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now())
FROM {schema}.conversations c WHERE c.id = $1 FOR UPDATE OF c SKIP LOCKED;

-- Whether conversation $1 has a live holder, read without a lock: what a dry
-- run needs to know the batch's LockConversationForPrune would say.
--
-- ConversationHeld reports whether a live holder has conv's lease (false for
-- a conversation that does not exist).
--
-- Locks: none (a read).
-- name: ConversationHeld
SELECT EXISTS (SELECT 1 FROM {schema}.holders hl WHERE hl.id = c.holder_id AND hl.expires_at >= now()) FROM {schema}.conversations c WHERE c.id = $1;

-- What a prune may delete of conversation $1 with cutoff $2: the tasks of
-- its ripe turns (up to $3, newest id first, so that every task's
-- descendants come with it), and whether the conversation is wholly out of
-- use. A turn is ripe when no task of its tree is live and every one settled
-- before the cutoff, and, while the conversation is in use (a live task, or
-- anything newer than the cutoff), it is neither the conversation's newest
-- settled turn nor its newest settled turn that is not a steered message's
-- (cancelled because another turn took the message: the turn that answered
-- is the context to keep). Its walks, up from the live tasks and down from
-- the roots, are shaped as the abort's (internal/store/tree.go), so that
-- their plans do not depend on statistics.
--
-- PruneVictims returns up to limit tasks of conv's ripe turns (newest id
-- first), how many turns are ripe, and whether the conversation is wholly
-- out of use (see PruneVictims).
--
-- Locks: none (a read).
-- name: PruneVictims
WITH RECURSIVE
live_up AS (
    SELECT t.id, t.owner_task_id FROM {schema}.tasks t WHERE t.conversation_id = $1 AND t.status IN ({live})
    UNION
    SELECT o.id, o.owner_task_id FROM live_up l CROSS JOIN LATERAL (SELECT o.id, o.owner_task_id FROM {schema}.tasks o
        WHERE o.conversation_id = $1 AND o.id = l.owner_task_id OFFSET 0) o),
in_use AS (SELECT EXISTS (SELECT 1 FROM live_up)
    OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = $1 AND (t.settled_at >= $2 OR t.created_at >= $2))
    OR EXISTS (SELECT 1 FROM {schema}.events e WHERE e.conversation_id = $1 AND e.emitted_at >= $2)
    OR EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.id = $1 AND c.created_at >= $2) AS v),
newest AS (SELECT max(id) AS id FROM {schema}.tasks
    WHERE conversation_id = $1 AND owner_task_id IS NULL AND status NOT IN ({live})),
newest_answer AS (SELECT max(id) AS id FROM {schema}.tasks
    WHERE conversation_id = $1 AND owner_task_id IS NULL AND status NOT IN ({live})
      AND error->>'code' IS DISTINCT FROM 'steered'),
roots AS (
    SELECT r.id FROM {schema}.tasks r
    WHERE r.conversation_id = $1 AND r.owner_task_id IS NULL AND r.settled_at < $2
      AND r.id NOT IN (SELECT id FROM live_up)
      AND (NOT (SELECT v FROM in_use)
        OR (r.id <> (SELECT id FROM newest) AND r.id IS DISTINCT FROM (SELECT id FROM newest_answer)))),
tree AS (
    SELECT r.id AS root, r.id, t.settled_at FROM roots r JOIN {schema}.tasks t ON t.id = r.id
    UNION ALL
    SELECT tr.root, c.id, c.settled_at FROM tree tr CROSS JOIN LATERAL (SELECT c.id, c.settled_at FROM {schema}.tasks c
        WHERE c.conversation_id = $1 AND c.owner_task_id = tr.id OFFSET 0) c),
ripe AS (SELECT root FROM tree GROUP BY root HAVING bool_and(settled_at IS NOT NULL AND settled_at < $2))
SELECT coalesce((SELECT array_agg(id) FROM (
    SELECT id FROM tree WHERE root IN (SELECT root FROM ripe) ORDER BY id DESC LIMIT $3) v), '{}'),
    coalesce((SELECT count(*) FROM ripe), 0),
    NOT (SELECT v FROM in_use);

-- DeleteTasks deletes tasks ids of conv and returns how many.
--
-- Locks: row locks on what it writes (deletes from tasks), held until the
-- transaction ends.
-- name: DeleteTasks
DELETE FROM {schema}.tasks WHERE conversation_id = $1 AND id = ANY($2::bigint[]);

-- A conversation is deleted when no task is left (the guard checks it, and
-- that no live holder has it).
--
-- DeleteConversation deletes conv if it has no task left, and reports
-- whether it did.
--
-- Locks: row locks on what it writes (deletes from conversations), held
-- until the transaction ends.
-- name: DeleteConversation
DELETE FROM {schema}.conversations c WHERE c.id = $1
AND NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = $1);
