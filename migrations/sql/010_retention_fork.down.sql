CREATE OR REPLACE FUNCTION {schema}.log_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           CASE WHEN n.owner_task_id IS NOT NULL THEN jsonb_build_object('owner', n.owner_task_id) END
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END $$;
DROP INDEX {schema}.tasks_settled_roots_idx;
DROP INDEX {schema}.tasks_owner_idx;
DROP INDEX {schema}.events_task_idx;
DROP INDEX {schema}.events_delivered_to_idx;
ALTER TABLE {schema}.tasks DROP COLUMN forked_from;
