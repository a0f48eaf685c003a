-- A settle's log entry carries its error's message beside its code
-- (issue 19): an abort's reason (tasks.WithReason, error {code "aborted",
-- message: the reason}) reached the task's row but not its log entry, so a
-- follower of the conversation (arbor log, the web view, an SSE stream)
-- saw "aborted" without why. The payload keeps its keys ("error" is still
-- the code) and gains "message". The message is bounded already: the
-- engine truncates a failure's to Config.MaxErrorMessageBytes and an abort
-- reason is at most 200 bytes. Replaces 007_events_log's function; the
-- trigger is unchanged.
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
