-- The log's guard check, planned once per session (issue 42).
--
-- The baseline's check ran through EXECUTE, planned again at every
-- statement that logs: a plan PL/pgSQL keeps from a session's first
-- statement, made while the tables held a page or two, would have read the
-- whole tasks table once per entry once it had grown. Planning it again
-- cost more than the check itself (40 µs per task in bench (a), 177 in
-- (h): docs/performance.md, "The per-row budget"). The check is now plain
-- SQL, whose plan PL/pgSQL keeps, and the function runs with sequential
-- scans off, so that a plan made over small tables looks rows up by their
-- indexes as a plan made over large ones does (every lookup here is by a
-- key: the entry's seq, its task's id, its conversation's id, an event's
-- id). TestLogGuardKeepsItsPlanAfterGrowth keeps it so.
CREATE OR REPLACE FUNCTION {schema}.log_guard_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $guard$
DECLARE
    bad_seq bigint;
    bad_kind text;
BEGIN
    SELECT a.seq, a.kind INTO bad_seq, bad_kind
    FROM added a
    CROSS JOIN LATERAL (SELECT l.xmin FROM {schema}.conversation_log l WHERE l.seq = a.seq OFFSET 0) l
    LEFT JOIN LATERAL (SELECT c.created_at FROM {schema}.conversations c
        WHERE (a.task_id IS NULL OR a.kind = 'event') AND c.id = a.conversation_id OFFSET 0) c ON true
    LEFT JOIN LATERAL (SELECT t.status, t.forked_from, t.created_at, t.xmin FROM {schema}.tasks t
        WHERE t.id = a.task_id AND t.conversation_id = a.conversation_id OFFSET 0) t ON true
    CROSS JOIN LATERAL (SELECT CASE
        WHEN a.task_id IS NOT NULL THEN t.forked_from IS NOT NULL AND t.xmin = l.xmin
        WHEN c.created_at = now() THEN (SELECT f.xmin FROM {schema}.tasks f
            WHERE f.conversation_id = a.conversation_id AND f.forked_from IS NOT NULL LIMIT 1) = l.xmin
        ELSE false END AS copy) k
    WHERE (c.created_at IS NULL AND (a.task_id IS NULL OR a.kind = 'event'))
       OR a.at > clock_timestamp()
       OR (a.task_id IS NOT NULL AND t.status IS NULL)
       OR (a.kind IN ('status', 'progress') AND a.task_id IS NULL)
       OR (a.kind = 'status' AND a.status IS NULL)
       OR (NOT coalesce(k.copy, false) AND (
              (a.kind = 'status' AND (t.forked_from IS NOT NULL OR a.status IS DISTINCT FROM t.status OR t.xmin <> l.xmin))
           OR (a.kind = 'progress' AND (t.forked_from IS NOT NULL OR t.status <> 'running'))
           OR a.at < c.created_at
           OR a.at < t.created_at
           OR (a.kind = 'event' AND NOT coalesce(
                jsonb_typeof(a.payload) = 'object' AND a.payload->>'event_id' ~ '^[0-9]{1,18}$'
                AND EXISTS (SELECT 1 FROM {schema}.events ev
                    WHERE ev.id = (a.payload->>'event_id')::bigint AND ev.conversation_id = a.conversation_id
                      AND ev.name IS NOT DISTINCT FROM a.name
                      AND (a.task_id IS NULL OR ev.task_id IS NOT DISTINCT FROM a.task_id)), false))))
    LIMIT 1;
    IF bad_seq IS NOT NULL THEN
        RAISE EXCEPTION 'arbor: log entry % (%) is not one arbor writes: the log records what the tasks and events are, appended by the statements that change them', bad_seq, bad_kind
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;
