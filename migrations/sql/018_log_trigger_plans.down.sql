-- Restores 014_log_error_message's function.
CREATE OR REPLACE FUNCTION {schema}.log_task_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           nullif(jsonb_strip_nulls(jsonb_build_object(
               'owner', n.owner_task_id,
               'error', CASE WHEN n.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN n.error->>'code' END,
               'message', CASE WHEN n.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN nullif(n.error->>'message', '') END,
               'await', CASE WHEN n.status = 'sleeping' THEN n.await_name END)), '{}'::jsonb)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.status <> n.status
    ORDER BY n.settle_seq NULLS FIRST, n.id;
    RETURN NULL;
END $$;
