-- Migration 019's event_guard: a delivery stamped now().
CREATE OR REPLACE FUNCTION {schema}.event_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.delivered_to IS NULL AND NEW.emitted_at = now() THEN
            RETURN NEW;
        END IF;
        IF NEW.emitted_at <= now() AND (NEW.delivered_at IS NULL OR NEW.delivered_at <= now())
            AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = NEW.conversation_id
                AND t.id IN (NEW.task_id, NEW.delivered_to) AND t.forked_from IS NOT NULL) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'arbor: an event is inserted undelivered by an emit, or as a fork''s copy of one'
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.id <> OLD.id OR NEW.conversation_id <> OLD.conversation_id
        OR NEW.task_id IS DISTINCT FROM OLD.task_id OR NEW.name <> OLD.name
        OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
        OR NEW.queued <> OLD.queued OR NEW.emitted_at <> OLD.emitted_at THEN
        RAISE EXCEPTION 'arbor: event %: only its delivery ever changes', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.delivered_to IS NOT DISTINCT FROM OLD.delivered_to AND NEW.delivered_at IS NOT DISTINCT FROM OLD.delivered_at THEN
        RETURN NEW;
    END IF;
    IF OLD.delivered_to IS NOT NULL OR NEW.delivered_to IS NULL OR NEW.delivered_at <> now() THEN
        RAISE EXCEPTION 'arbor: event %: it is delivered once, stamped now, and never undelivered', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF NOT ((OLD.task_id IS NULL OR OLD.task_id = NEW.delivered_to)
        AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.delivered_to AND t.conversation_id = NEW.conversation_id
            AND t.status = 'sleeping' AND t.await_name = NEW.name)) THEN
        RAISE EXCEPTION 'arbor: event % is delivered only to a task of its address that awaits it (task %)', OLD.id, NEW.delivered_to
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;
