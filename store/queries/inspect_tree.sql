-- The statements internal/store/inspect_tree.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).


-- ChildCounts counts the children of each of owners (those with none are
-- absent).
--
-- Locks: none (a read).
-- name: ChildCounts
SELECT owner_task_id, count(*) FROM {schema}.tasks
WHERE conversation_id = $1 AND owner_task_id = ANY($2) GROUP BY owner_task_id;

-- StatusCounts counts conv's tasks by status, reading at most limit.
--
-- Locks: none (a read).
-- name: StatusCounts
SELECT t.status, count(*) FROM (
    SELECT status FROM {schema}.tasks WHERE conversation_id = $1 LIMIT $2) t GROUP BY t.status;

-- AwaitsAfter lists up to limit tasks awaiting an event (each with its
-- AwaitToken), across conversations, after the key (conversation, await
-- name, task id) in the order of the awaiting index.
--
-- Locks: none (a read).
-- name: AwaitsAfter
SELECT {summary_columns}, coalesce(cardinality(wait_ids), 0) FROM {schema}.tasks
WHERE status = 'sleeping' AND await_name IS NOT NULL AND (conversation_id, await_name, id) > ($1, $2, $3)
ORDER BY conversation_id, await_name, id LIMIT $4;

-- ConversationAwaitsAfter lists up to limit tasks of conv awaiting an event,
-- after the key (await name, task id).
--
-- Locks: none (a read).
-- name: ConversationAwaitsAfter
SELECT {summary_columns}, coalesce(cardinality(wait_ids), 0) FROM {schema}.tasks
WHERE conversation_id = $1 AND status = 'sleeping' AND await_name IS NOT NULL AND (await_name, id) > ($2, $3)
ORDER BY await_name, id LIMIT $4;

-- A page of a conversation's tasks in id order (ancestors first), by its end
-- of the (conversation_id, id) index.
--
-- TreePage reads up to limit tasks of conv after task id after, in id order,
-- those in statuses when it is not empty.
--
-- Locks: none (a read).
-- name: TreePage
SELECT {summary_columns}, coalesce(cardinality(wait_ids), 0) FROM {schema}.tasks
WHERE conversation_id = $1 AND id > $2 AND (cardinality($3::text[]) = 0 OR status = ANY($3::text[]))
ORDER BY id LIMIT $4;

-- ChildrenPage reads up to limit children of owner after task id after, in
-- id order.
--
-- Locks: none (a read).
-- name: ChildrenPage
SELECT {summary_columns}, coalesce(cardinality(wait_ids), 0) FROM {schema}.tasks
WHERE conversation_id = $1 AND owner_task_id = $2 AND id > $3 ORDER BY id LIMIT $4;
