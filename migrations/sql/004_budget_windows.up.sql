-- Budgets per tenant and per window (issue 40 item 5; docs/design.md
-- §3.11): a tenant's budgets of a counter across all its conversations,
-- each with an optional calendar window (UTC) after which its spend starts
-- again from 0, checked by every reservation after the task's, its owners'
-- and the conversation's budgets, and locked last.

-- A tenant's budget of one counter for one window ('' none, or 'minute',
-- 'hour', 'day'): spent counts the closes of the current window (from
-- window_start), reserved the open reservations that charged it, whatever
-- window they were made in.
CREATE TABLE {schema}.tenant_budgets (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant       text        NOT NULL CHECK (octet_length(tenant) <= 200),
    counter      text        NOT NULL CHECK (counter ~ '^[a-z][a-z0-9_.]{0,62}$' AND counter <> 'wall_ms'),
    window_unit  text        NOT NULL DEFAULT '' CHECK (window_unit IN ('', 'minute', 'hour', 'day')),
    window_start timestamptz,
    max          bigint      CHECK (max >= 0),
    spent        bigint      NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved     bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    on_exhausted text        NOT NULL DEFAULT 'fail' CHECK (on_exhausted IN ('fail', 'park', 'return')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((window_unit = '') = (window_start IS NULL))
);
CREATE UNIQUE INDEX tenant_budgets_scope_idx ON {schema}.tenant_budgets (tenant, counter, window_unit);

-- The tenant budgets a reservation charged when it was made: its close
-- charges exactly these (a budget set later is not held by it).
ALTER TABLE {schema}.budget_reservations ADD COLUMN tenant_budgets bigint[] NOT NULL DEFAULT '{}';

-- tenant_budgets: inserted empty, stamped now, its window the current one;
-- its tenant, counter and window never change; its window only moves
-- forward, to a window's start, and its spend then starts from 0; else its
-- spend only grows; its max and action are the user's (SetBudget); it is
-- never deleted (set it Unlimited instead).
CREATE FUNCTION {schema}.tenant_budget_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'arbor: tenant budget % of %: never deleted', OLD.counter, OLD.tenant
            USING ERRCODE = 'AB009';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT coalesce(NEW.spent = 0 AND NEW.reserved = 0 AND NEW.created_at = now()
                AND NEW.window_start IS NOT DISTINCT FROM
                    CASE WHEN NEW.window_unit = '' THEN NULL ELSE date_trunc(NEW.window_unit, now(), 'UTC') END, false) THEN
            RAISE EXCEPTION 'arbor: a tenant budget is inserted empty, stamped now, in the current window'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.tenant IS DISTINCT FROM OLD.tenant
        OR NEW.counter IS DISTINCT FROM OLD.counter OR NEW.window_unit IS DISTINCT FROM OLD.window_unit
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'arbor: tenant budget % of %: its tenant, counter and window never change', OLD.counter, OLD.tenant
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.window_start IS DISTINCT FROM OLD.window_start THEN
        IF NOT coalesce(NEW.window_start > OLD.window_start AND NEW.spent = 0
                AND NEW.window_start = date_trunc(NEW.window_unit, NEW.window_start, 'UTC')
                AND NEW.window_start <= now(), false) THEN
            RAISE EXCEPTION 'arbor: tenant budget % of %: its window only moves forward to a window''s start, its spend from 0',
                OLD.counter, OLD.tenant USING ERRCODE = 'AB009';
        END IF;
    ELSIF NEW.spent < OLD.spent THEN
        RAISE EXCEPTION 'arbor: tenant budget % of %: its spend only grows within a window (% -> %)',
            OLD.counter, OLD.tenant, OLD.spent, NEW.spent USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

CREATE TRIGGER tenant_budget_guard BEFORE INSERT ON {schema}.tenant_budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.tenant_budget_guard();
CREATE TRIGGER "Arbor_tenant_budget_guard_update" AFTER UPDATE OR DELETE ON {schema}.tenant_budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.tenant_budget_guard();
CREATE TRIGGER tenant_budget_guard_truncate BEFORE TRUNCATE ON {schema}.tenant_budgets
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- A reservation's tenant budgets are written with it and never change.
CREATE FUNCTION {schema}.reservation_tenant_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: reservation %: its tenant budgets never change', OLD.id
        USING ERRCODE = 'AB009';
END
$guard$;

CREATE TRIGGER "Arbor_reservation_tenant_guard" AFTER UPDATE OF tenant_budgets ON {schema}.budget_reservations
    FOR EACH ROW WHEN (NEW.tenant_budgets IS DISTINCT FROM OLD.tenant_budgets)
    EXECUTE FUNCTION {schema}.reservation_tenant_guard();

-- tenant_budgets_lock locks the tenant's budgets of the counter FOR
-- UPDATE, by id (the one order every writer takes them in, after all its
-- other locks), rolls over each whose window is over (window_start to the
-- current window's start in UTC, spent to 0; reserved is carried), and
-- returns their ids by id. Every writer of a tenant budget's amounts calls
-- it first: budget_reserve, budget_record, and the engine's lapses and
-- prunes (store: LockTenantBudgets).
CREATE FUNCTION {schema}.tenant_budgets_lock(p_tenant text, p_counter text) RETURNS bigint[]
LANGUAGE plpgsql AS $fn$
DECLARE
    ids bigint[];
BEGIN
    SELECT coalesce(array_agg(l.id ORDER BY l.id), '{}') INTO ids FROM (SELECT b.id FROM {schema}.tenant_budgets b
        WHERE b.tenant = p_tenant AND b.counter = p_counter
        ORDER BY b.id FOR UPDATE) l;
    IF cardinality(ids) > 0 THEN
        UPDATE {schema}.tenant_budgets b
        SET window_start = date_trunc(b.window_unit, now(), 'UTC'), spent = 0, updated_at = now()
        WHERE b.id = ANY (ids) AND b.window_unit <> '' AND date_trunc(b.window_unit, now(), 'UTC') > b.window_start;
    END IF;
    RETURN ids;
END
$fn$;

-- A reservation still open when the prune deletes it (its run long over)
-- is spent in full on the tenant budgets it charged, as a lapse would, in
-- the prune's transaction: its tenant's rows of the counter locked last.
CREATE FUNCTION {schema}.reservation_tenant_release() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM {schema}.tenant_budgets_lock(
        (SELECT cv.tenant FROM {schema}.conversations cv WHERE cv.id = OLD.conversation_id), OLD.counter);
    UPDATE {schema}.tenant_budgets tb
    SET reserved = tb.reserved - OLD.amount, spent = tb.spent + OLD.amount, updated_at = now()
    WHERE tb.id = ANY (OLD.tenant_budgets);
    RETURN NULL;
END
$fn$;

CREATE TRIGGER "Arbor_reservation_tenant_release" AFTER DELETE ON {schema}.budget_reservations
    FOR EACH ROW WHEN (OLD.actual IS NULL AND cardinality(OLD.tenant_budgets) > 0)
    EXECUTE FUNCTION {schema}.reservation_tenant_release();

-- budget_reserve and budget_record as in the baseline, with the tenant's
-- budgets of the counter locked last (tenant_budgets_lock), checked and
-- charged with the others: a tenant budget over, like any budget over,
-- leaves the reservation to the engine ('rare'); a counter only a tenant
-- budget names is known.
CREATE OR REPLACE FUNCTION {schema}.budget_reserve(p_conversation text, p_task bigint, p_token bigint, p_counter text,
        p_amount bigint, p_key text, p_spend boolean,
        OUT outcome text, OUT task_status text, OUT task_token bigint,
        OUT r_id bigint, OUT r_conversation text, OUT r_task bigint, OUT r_counter text, OUT r_token bigint,
        OUT r_key text, OUT r_amount bigint, OUT r_actual bigint, OUT r_lapsed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    scopes bigint[];
    born timestamptz[];
    v_tenant text;
    tenant_ids bigint[];
BEGIN
    SELECT t.status, coalesce(t.token, 0), t.tenant INTO task_status, task_token, v_tenant
    FROM {schema}.tasks t WHERE t.id = p_task AND t.conversation_id = p_conversation
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'no_task';
        RETURN;
    END IF;
    SELECT r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed
    FROM {schema}.budget_reservations r
    WHERE r.conversation_id = p_conversation AND r.task_id = p_task AND r.idempotency_key = p_key;
    IF FOUND THEN
        outcome := 'again';
        RETURN;
    END IF;
    IF task_status <> 'running' OR task_token <> p_token THEN
        outcome := 'not_held';
        RETURN;
    END IF;

    -- The scopes: the task, its owners up to the root, the conversation (0).
    WITH RECURSIVE chain (id, owner_task_id, created_at, depth) AS (
        SELECT t.id, t.owner_task_id, t.created_at, 0 FROM {schema}.tasks t
        WHERE t.conversation_id = p_conversation AND t.id = p_task
        UNION ALL
        SELECT t.id, t.owner_task_id, t.created_at, c.depth + 1 FROM chain c
        JOIN {schema}.tasks t ON t.conversation_id = p_conversation AND t.id = c.owner_task_id)
    SELECT array_agg(c.id ORDER BY c.depth), array_agg(c.created_at ORDER BY c.depth) INTO scopes, born FROM chain c;
    scopes := scopes || 0::bigint;
    born := born || (SELECT cv.created_at FROM {schema}.conversations cv WHERE cv.id = p_conversation);

    -- Every budget of the counter and of wall time in the conversation, in
    -- the one order every writer locks them.
    PERFORM FROM (SELECT FROM {schema}.budgets b
        WHERE b.conversation_id = p_conversation AND b.counter IN (p_counter, 'wall_ms')
        ORDER BY b.counter, coalesce(b.task_id, 0)
        FOR UPDATE) locked;
    -- Then the tenant's budgets of the counter, last (by id), their
    -- windows rolled over when the clock is past their end.
    tenant_ids := {schema}.tenant_budgets_lock(v_tenant, p_counter);

    IF EXISTS (SELECT FROM {schema}.budget_reservations r
            JOIN {schema}.tasks t ON t.conversation_id = r.conversation_id AND t.id = r.task_id
            WHERE r.conversation_id = p_conversation AND r.counter = p_counter AND r.actual IS NULL
              AND NOT (t.status = 'running' AND t.token IS NOT DISTINCT FROM r.run_token))
        OR (NOT EXISTS (SELECT FROM {schema}.budgets b WHERE b.conversation_id = p_conversation AND b.counter = p_counter)
            AND cardinality(tenant_ids) = 0)
        OR EXISTS (SELECT FROM {schema}.tenant_budgets tb WHERE tb.id = ANY (tenant_ids)
            AND tb.max IS NOT NULL AND p_amount > tb.max - tb.spent - tb.reserved)
        OR EXISTS (SELECT FROM unnest(scopes, born) s (scope, created_at)
            JOIN {schema}.budgets b ON b.conversation_id = p_conversation AND b.counter IN (p_counter, 'wall_ms')
                AND coalesce(b.task_id, 0) = s.scope
            WHERE b.max IS NOT NULL
              AND CASE WHEN b.counter = 'wall_ms'
                  THEN trunc(extract(epoch FROM now() - s.created_at) * 1000) >= b.max
                  ELSE p_amount > b.max - b.spent - b.reserved END) THEN
        outcome := 'rare';
        RETURN;
    END IF;

    UPDATE {schema}.budgets b
    SET reserved = b.reserved + CASE WHEN p_spend THEN 0 ELSE p_amount END,
        spent = b.spent + CASE WHEN p_spend THEN p_amount ELSE 0 END,
        updated_at = now()
    WHERE b.conversation_id = p_conversation AND b.counter = p_counter AND coalesce(b.task_id, 0) = ANY (scopes);
    UPDATE {schema}.tenant_budgets tb
    SET reserved = tb.reserved + CASE WHEN p_spend THEN 0 ELSE p_amount END,
        spent = tb.spent + CASE WHEN p_spend THEN p_amount ELSE 0 END,
        updated_at = now()
    WHERE tb.id = ANY (tenant_ids);
    INSERT INTO {schema}.budget_reservations AS r
        (conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, closed_at, tenant_budgets)
    VALUES (p_conversation, p_task, p_counter, p_token, p_key, p_amount,
        CASE WHEN p_spend THEN p_amount END, CASE WHEN p_spend THEN now() END, tenant_ids)
    RETURNING r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed;
    outcome := 'reserved';
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.budget_record(p_conversation text, p_task bigint, p_id bigint, p_actual bigint,
        OUT outcome text,
        OUT r_id bigint, OUT r_conversation text, OUT r_task bigint, OUT r_counter text, OUT r_token bigint,
        OUT r_key text, OUT r_amount bigint, OUT r_actual bigint, OUT r_lapsed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    scopes bigint[];
    tenant_ids bigint[];
BEGIN
    SELECT r.counter, r.tenant_budgets INTO r_counter, tenant_ids FROM {schema}.budget_reservations r
    WHERE r.conversation_id = p_conversation AND r.id = p_id AND r.task_id = p_task;
    IF NOT FOUND THEN
        outcome := 'no_reservation';
        RETURN;
    END IF;
    PERFORM FROM (SELECT FROM {schema}.budgets b
        WHERE b.conversation_id = p_conversation AND b.counter = r_counter
        ORDER BY b.counter, coalesce(b.task_id, 0)
        FOR UPDATE) locked;
    IF cardinality(tenant_ids) > 0 THEN
        PERFORM {schema}.tenant_budgets_lock(
            (SELECT cv.tenant FROM {schema}.conversations cv WHERE cv.id = p_conversation), r_counter);
    END IF;
    SELECT r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed
    FROM {schema}.budget_reservations r WHERE r.conversation_id = p_conversation AND r.id = p_id;
    IF r_actual IS NOT NULL THEN
        outcome := 'closed';
        RETURN;
    END IF;

    WITH RECURSIVE chain (id, owner_task_id) AS (
        SELECT t.id, t.owner_task_id FROM {schema}.tasks t
        WHERE t.conversation_id = p_conversation AND t.id = p_task
        UNION ALL
        SELECT t.id, t.owner_task_id FROM chain c
        JOIN {schema}.tasks t ON t.conversation_id = p_conversation AND t.id = c.owner_task_id)
    SELECT array_agg(c.id) || 0::bigint INTO scopes FROM chain c;

    UPDATE {schema}.budget_reservations r SET actual = p_actual, lapsed = false, closed_at = now()
    WHERE r.conversation_id = p_conversation AND r.id = p_id AND r.actual IS NULL;
    IF NOT FOUND THEN
        -- Closed between the reading and this close: not under the locks
        -- every closer takes, so never, but nothing is charged for it.
        outcome := 'raced';
        RETURN;
    END IF;
    UPDATE {schema}.budgets b
    SET reserved = b.reserved - r_amount, spent = b.spent + p_actual, updated_at = now()
    WHERE b.conversation_id = p_conversation AND b.counter = r_counter AND coalesce(b.task_id, 0) = ANY (scopes);
    UPDATE {schema}.tenant_budgets tb
    SET reserved = tb.reserved - r_amount, spent = tb.spent + p_actual, updated_at = now()
    WHERE tb.id = ANY (tenant_ids);
    r_actual := p_actual;
    outcome := 'recorded';
END
$fn$;
