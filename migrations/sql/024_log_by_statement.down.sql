-- A fork copies the source's log entries itself (in their order, with the
-- copies' ids): the rows it inserts log nothing of their own.
CREATE FUNCTION {schema}.log_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           CASE WHEN n.owner_task_id IS NOT NULL THEN jsonb_build_object('owner', n.owner_task_id) END
    FROM new_rows n WHERE n.forked_from IS NULL ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER log_task_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_task_insert();

CREATE FUNCTION {schema}.log_task_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE $q$
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           nullif(jsonb_strip_nulls(jsonb_build_object(
               'owner', n.owner_task_id,
               'error', CASE WHEN n.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN n.error->>'code' END,
               'message', CASE WHEN n.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN nullif(n.error->>'message', '') END,
               'await', CASE WHEN n.status = 'sleeping' THEN n.await_name END)), '{}'::jsonb)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.status <> n.status
    ORDER BY n.settle_seq NULLS FIRST, n.id
    $q$;
    RETURN NULL;
END $$;
CREATE TRIGGER log_task_update AFTER UPDATE ON {schema}.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_task_update();
