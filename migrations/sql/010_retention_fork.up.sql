-- Retention and fork (issue 14; docs/operations.md "Retention",
-- docs/agents.md "Fork: edit and regenerate").
--
-- forked_from is the task a fork copied the row from (in another
-- conversation); the guard (the next migration) lets a settled row be
-- inserted only as a faithful copy of its source. No foreign key: the
-- source may be pruned later, and the copy stands on its own.
ALTER TABLE {schema}.tasks ADD COLUMN forked_from bigint;

-- The prune walks settled turns (root tasks) oldest first, across
-- conversations.
CREATE INDEX tasks_settled_roots_idx ON {schema}.tasks (settled_at, id)
    WHERE owner_task_id IS NULL AND settled_at IS NOT NULL;

-- Deleting a task checks that nothing refers to it (the ownership and the
-- events' foreign keys): without these, each deleted row would scan its
-- conversation's tasks and the whole events table. Only settled rows are
-- looked up through them (live children have tasks_live_children_idx).
CREATE INDEX tasks_owner_idx ON {schema}.tasks (conversation_id, owner_task_id)
    WHERE owner_task_id IS NOT NULL;
CREATE INDEX events_task_idx ON {schema}.events (conversation_id, task_id) WHERE task_id IS NOT NULL;
CREATE INDEX events_delivered_to_idx ON {schema}.events (conversation_id, delivered_to) WHERE delivered_to IS NOT NULL;

-- A fork copies the source's log entries itself (in their order, with the
-- copies' ids): the rows it inserts log nothing of their own.
CREATE OR REPLACE FUNCTION {schema}.log_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           CASE WHEN n.owner_task_id IS NOT NULL THEN jsonb_build_object('owner', n.owner_task_id) END
    FROM new_rows n WHERE n.forked_from IS NULL ORDER BY n.id;
    RETURN NULL;
END $$;
