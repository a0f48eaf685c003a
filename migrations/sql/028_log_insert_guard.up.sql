-- The conversation log's INSERT guard (issue 24). UPDATE, DELETE and
-- TRUNCATE of the log were refused (019, 023); an INSERT written by hand
-- was not: a forged status entry, a progress entry no run wrote, or an
-- event entry no emit wrote went in, and the invariant checker was left to
-- report them. Now an entry is accepted only as arbor writes it:
--
--   - every entry names an existing conversation, and a task (if any) of
--     that conversation, and is not stamped in the future;
--   - a status entry names its task's status as the statement left it
--     (every statement that changes a status logs it in the same statement,
--     internal/store/logstatus.go);
--   - a progress entry names a task that is running (Run.Progress writes
--     only under its run's token);
--   - an event entry names, by its id, an event of the conversation with
--     the entry's name (and its task, if the entry names one).
--
-- A fork copies a conversation's log with its tasks: the copies of a
-- task's entries (forked_from set: a settled copy) carry its past
-- statuses, and a copied event entry names the event's copy or, when the
-- event was not copied, none. Those are accepted as they are: entries of a
-- task that is a fork's copy, and event entries stamped before their
-- conversation was created (a fork stamps a copy with its source's time;
-- a conversation's own entries are stamped by the database, after it).
--
-- The check is one statement per INSERT statement, over its new rows
-- (a transition table), each looked up by key in a LATERAL subquery that
-- the planner cannot turn into a join over the whole table (OFFSET 0):
-- its cost is linear in the rows inserted whatever the statistics, and it
-- holds no lock. An entry that names a task is looked up by its task alone
-- (the task's foreign key vouches for the conversation); the conversation
-- is read for the others and for event entries. A refusal raises AB009
-- (fsm.SQLStateRecord), which the engine reports as ErrInvalidTransition.
CREATE FUNCTION {schema}.log_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    bad_seq bigint;
    bad_kind text;
BEGIN
    SELECT a.seq, a.kind INTO bad_seq, bad_kind
    FROM added a
    LEFT JOIN LATERAL (SELECT c.created_at FROM {schema}.conversations c
        WHERE (a.task_id IS NULL OR a.kind = 'event') AND c.id = a.conversation_id OFFSET 0) c ON true
    LEFT JOIN LATERAL (SELECT t.status, t.forked_from FROM {schema}.tasks t
        WHERE t.id = a.task_id AND t.conversation_id = a.conversation_id OFFSET 0) t ON true
    WHERE (c.created_at IS NULL AND (a.task_id IS NULL OR a.kind = 'event'))
       OR a.at > clock_timestamp()
       OR (a.task_id IS NOT NULL AND t.status IS NULL)
       OR (a.kind = 'status' AND t.forked_from IS NULL AND a.status IS DISTINCT FROM t.status)
       OR (a.kind = 'progress' AND (a.task_id IS NULL OR (t.forked_from IS NULL AND t.status <> 'running')))
       OR (a.kind = 'event' AND t.forked_from IS NULL AND a.at >= c.created_at AND NOT coalesce(
            jsonb_typeof(a.payload) = 'object' AND a.payload->>'event_id' ~ '^[0-9]{1,18}$'
            AND EXISTS (SELECT 1 FROM {schema}.events ev
                WHERE ev.id = (a.payload->>'event_id')::bigint AND ev.conversation_id = a.conversation_id
                  AND ev.name IS NOT DISTINCT FROM a.name
                  AND (a.task_id IS NULL OR ev.task_id IS NOT DISTINCT FROM a.task_id)), false))
    LIMIT 1;
    IF bad_seq IS NOT NULL THEN
        RAISE EXCEPTION 'arbor: log entry % (%) is not one arbor writes: the log records what the tasks and events are, appended by the statements that change them', bad_seq, bad_kind
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;

CREATE TRIGGER "Arbor_log_guard_insert" AFTER INSERT ON {schema}.conversation_log
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_guard_insert();
