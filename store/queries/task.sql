-- The statements internal/store/task.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).


-- GetTask reads one task without locking it.
--
-- Locks: none (a read).
-- name: GetTask
SELECT {task_columns} FROM {schema}.tasks WHERE id = $1;

-- LockTask reads one task and locks its row until the transaction ends.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects, held until the
-- transaction ends.
-- name: LockTask
SELECT {task_columns} FROM {schema}.tasks WHERE id = $1 AND conversation_id = $2 FOR NO KEY UPDATE;

-- GetTasks reads the tasks with the given ids, in id order; ids that do not
-- exist are left out.
--
-- Locks: none (a read).
-- name: GetTasks
SELECT {task_columns} FROM {schema}.tasks WHERE id = ANY($1) ORDER BY id;

-- TaskConversation returns the conversation a task belongs to, without
-- locking anything: conversation_id never changes, so the caller can lock
-- the conversation row first and the task after it.
--
-- Locks: none (a read).
-- name: TaskConversation
SELECT conversation_id FROM {schema}.tasks WHERE id = $1;

-- ConversationTasks reads every task of a conversation in id order.
--
-- Locks: none (a read).
-- name: ConversationTasks
SELECT {task_columns} FROM {schema}.tasks WHERE conversation_id = $1 ORDER BY id;

-- LiveChildren reads the live children of owner (foreground and background)
-- in id order.
--
-- Locks: none (a read).
-- name: LiveChildren
SELECT {task_columns} FROM {schema}.tasks
WHERE owner_task_id = $1 AND conversation_id = $2 AND status IN ({live}) ORDER BY id;

-- Children reads every child of owner in id order.
--
-- Locks: none (a read).
-- name: Children
SELECT {task_columns} FROM {schema}.tasks WHERE owner_task_id = $1 AND conversation_id = $2 ORDER BY id;

-- The first live foreground child is found by the live-children index and
-- EXISTS stops there, so this costs the same with 1 or 10,000 children.
--
-- Run by Store.HasLiveForegroundChildren.
--
-- Locks: none (a read).
-- name: HasLiveForeground
SELECT EXISTS (SELECT 1 FROM {schema}.tasks
    WHERE owner_task_id = $1 AND conversation_id = $2 AND NOT background AND status IN ({live}));

-- "id + 0" keeps the planner on the live-children index: probing the primary
-- key for every waited id would cost as many probes as children.
--
-- Run by Store.HasLiveWaitedChildren.
--
-- Locks: none (a read).
-- name: HasLiveWaited
SELECT EXISTS (SELECT 1 FROM {schema}.tasks
    WHERE owner_task_id = $1 AND conversation_id = $3 AND id + 0 = ANY($2) AND status IN ({live}));

-- Store.TaskByIdempotencyKey reads the task of a conversation created with
-- key.
--
-- Locks: none (a read).
-- name: TaskByKey
SELECT {task_columns} FROM {schema}.tasks WHERE conversation_id = $1 AND idempotency_key = $2;
