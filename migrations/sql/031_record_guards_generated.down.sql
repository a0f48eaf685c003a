-- Restores the record guards as migrations 019, 025 and 030 wrote them by
-- hand, before 031 generated them from fsm.RecordRules: each function as
-- its latest migration left it (event_guard 030's, holder_guard 025's, the
-- others 019's). The triggers that call them are unchanged by 031.

CREATE OR REPLACE FUNCTION {schema}.record_guard_delete() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF NOT {schema}.prune_marked() THEN
        RAISE EXCEPTION 'arbor: a row of %.% is deleted only by the prune', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'AB006';
    END IF;
    RETURN OLD;
END
$guard$;

CREATE OR REPLACE FUNCTION {schema}.record_guard_truncate() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: the % table cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'AB006';
END
$guard$;

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
    IF OLD.delivered_to IS NOT NULL OR NEW.delivered_to IS NULL OR NEW.delivered_at <> greatest(now(), OLD.emitted_at) THEN
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

CREATE OR REPLACE FUNCTION {schema}.log_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: log entry % is never changed (the log is append-only)', OLD.seq
        USING ERRCODE = 'AB009';
END
$guard$;

CREATE OR REPLACE FUNCTION {schema}.budget_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.carried <> 0 OR NEW.created_at <> now() THEN
            RAISE EXCEPTION 'arbor: a budget is inserted with nothing carried, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.conversation_id <> OLD.conversation_id OR NEW.task_id IS DISTINCT FROM OLD.task_id
        OR NEW.counter <> OLD.counter OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'arbor: budget % of %: its scope and counter never change', OLD.counter, OLD.conversation_id
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.spent < OLD.spent THEN
        RAISE EXCEPTION 'arbor: budget % of %: its spend only grows (% -> %)', OLD.counter, OLD.conversation_id, OLD.spent, NEW.spent
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.carried <> OLD.carried AND NOT (NEW.carried > OLD.carried AND NEW.task_id IS NULL AND {schema}.prune_marked()) THEN
        RAISE EXCEPTION 'arbor: budget % of %: only the prune carries spend, into the conversation''s budget', OLD.counter, OLD.conversation_id
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

CREATE OR REPLACE FUNCTION {schema}.reservation_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.created_at <> now() OR NEW.lapsed OR (NEW.actual IS NOT NULL AND (NEW.actual <> NEW.amount OR NEW.closed_at <> now()))
            OR NOT EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.task_id AND t.conversation_id = NEW.conversation_id
                AND t.status = 'running' AND t.token = NEW.run_token) THEN
            RAISE EXCEPTION 'arbor: a reservation is made by a run of its task, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id <> OLD.id OR NEW.conversation_id <> OLD.conversation_id OR NEW.task_id <> OLD.task_id
        OR NEW.counter <> OLD.counter OR NEW.run_token <> OLD.run_token OR NEW.idempotency_key <> OLD.idempotency_key
        OR NEW.amount <> OLD.amount OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'arbor: reservation %: only its close ever changes', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.actual IS NOT DISTINCT FROM OLD.actual AND NEW.lapsed = OLD.lapsed AND NEW.closed_at IS NOT DISTINCT FROM OLD.closed_at THEN
        RETURN NEW;
    END IF;
    IF OLD.actual IS NOT NULL OR NEW.actual IS NULL OR NEW.closed_at <> now() THEN
        RAISE EXCEPTION 'arbor: reservation %: it is closed once, stamped now, and never reopened', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

CREATE OR REPLACE FUNCTION {schema}.holder_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = OLD.id) THEN
            RAISE EXCEPTION 'arbor: holder % (%) is deleted only once it holds no conversation', OLD.id, OLD.name
                USING ERRCODE = 'AB006';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.created_at <> now() OR NEW.renewed_at <> now() OR NEW.expires_at < now() THEN
            RAISE EXCEPTION 'arbor: a holder is inserted live, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        IF NEW.expires_at > now() + interval '24 hours' THEN
            RAISE EXCEPTION 'arbor: holder % (%): a lease is at most a day, not until %', NEW.id, NEW.name, NEW.expires_at
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id <> OLD.id OR NEW.name <> OLD.name OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'arbor: holder % (%): only its renewal ever changes', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.expires_at = OLD.expires_at AND NEW.renewed_at = OLD.renewed_at THEN
        RETURN NEW;
    END IF;
    IF OLD.expires_at < now() OR NEW.expires_at < OLD.expires_at OR NEW.renewed_at <> now() THEN
        RAISE EXCEPTION 'arbor: holder % (%) is renewed only while live, stamped now, and its deadline never comes closer', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.expires_at > now() + interval '24 hours' THEN
        RAISE EXCEPTION 'arbor: holder % (%): a lease is at most a day, not until %', OLD.id, OLD.name, NEW.expires_at
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;
