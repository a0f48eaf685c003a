-- Removes what 004_budget_windows.up.sql adds, and restores the baseline's
-- budget_reserve and budget_record.
CREATE OR REPLACE FUNCTION {schema}.budget_reserve(p_conversation text, p_task bigint, p_token bigint, p_counter text,
        p_amount bigint, p_key text, p_spend boolean,
        OUT outcome text, OUT task_status text, OUT task_token bigint,
        OUT r_id bigint, OUT r_conversation text, OUT r_task bigint, OUT r_counter text, OUT r_token bigint,
        OUT r_key text, OUT r_amount bigint, OUT r_actual bigint, OUT r_lapsed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    scopes bigint[];
    born timestamptz[];
BEGIN
    SELECT t.status, coalesce(t.token, 0) INTO task_status, task_token
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

    IF EXISTS (SELECT FROM {schema}.budget_reservations r
            JOIN {schema}.tasks t ON t.conversation_id = r.conversation_id AND t.id = r.task_id
            WHERE r.conversation_id = p_conversation AND r.counter = p_counter AND r.actual IS NULL
              AND NOT (t.status = 'running' AND t.token IS NOT DISTINCT FROM r.run_token))
        OR NOT EXISTS (SELECT FROM {schema}.budgets b WHERE b.conversation_id = p_conversation AND b.counter = p_counter)
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
    INSERT INTO {schema}.budget_reservations AS r
        (conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, closed_at)
    VALUES (p_conversation, p_task, p_counter, p_token, p_key, p_amount,
        CASE WHEN p_spend THEN p_amount END, CASE WHEN p_spend THEN now() END)
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
BEGIN
    SELECT r.counter INTO r_counter FROM {schema}.budget_reservations r
    WHERE r.conversation_id = p_conversation AND r.id = p_id AND r.task_id = p_task;
    IF NOT FOUND THEN
        outcome := 'no_reservation';
        RETURN;
    END IF;
    PERFORM FROM (SELECT FROM {schema}.budgets b
        WHERE b.conversation_id = p_conversation AND b.counter = r_counter
        ORDER BY b.counter, coalesce(b.task_id, 0)
        FOR UPDATE) locked;
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
    r_actual := p_actual;
    outcome := 'recorded';
END
$fn$;

DROP TRIGGER "Arbor_reservation_tenant_release" ON {schema}.budget_reservations;
DROP FUNCTION {schema}.reservation_tenant_release();
DROP FUNCTION {schema}.tenant_budgets_lock(text, text);
DROP TRIGGER "Arbor_reservation_tenant_guard" ON {schema}.budget_reservations;
DROP FUNCTION {schema}.reservation_tenant_guard();
ALTER TABLE {schema}.budget_reservations DROP COLUMN tenant_budgets;
DROP TABLE {schema}.tenant_budgets;
DROP FUNCTION {schema}.tenant_budget_guard();
