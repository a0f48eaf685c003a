-- Guards for the tables the task guard does not cover (issue 24): events,
-- the conversation log, budgets and budget reservations took any UPDATE,
-- DELETE, INSERT or TRUNCATE written by hand, although docs/guarantees.md
-- promises that no event is lost and that the log is complete. Each table
-- now changes only in the ways arbor changes it (the statements of
-- store/event.go, store/budget.go, store/fork.go and store/retention.go);
-- a row of it is deleted only by the prune, and none is ever truncated.
-- A refusal raises AB009 (fsm.SQLStateRecord) for a forged row or change,
-- AB006 (fsm.SQLStateDelete) for a delete off the prune path or a
-- TRUNCATE; the engine reports both as ErrInvalidTransition.
--
-- The prune's mark. Until now the prune marked its transaction with
-- SET LOCAL arbor.prune = 'on', which any role may run: the guard of
-- deletes stopped only a mistake, not a role that meant it. The prune now
-- marks its transaction by inserting the transaction's id into
-- prune_marks (store.MarkPrune), and removes the row before it commits
-- (store.UnmarkPrune; a transaction that rolls back takes its row with it,
-- and a row left behind names a transaction that has ended, which no
-- other transaction can be). The guards ask prune_marked(), which runs
-- with its owner's rights (SECURITY DEFINER), so that a role that may not
-- read prune_marks can still be refused or let through by it. Only the
-- schema's owner, and a role it grants INSERT on prune_marks to, can mark
-- a transaction: the role that runs the prune (docs/operations.md, "Roles":
-- the runtime role's grant on all tables includes it; a role for anything
-- else is granted DML on the other tables and not on this one). A role
-- that may write prune_marks may prune by hand: it is the prune's role.
CREATE TABLE {schema}.prune_marks (
    txid xid8 PRIMARY KEY DEFAULT pg_current_xact_id()
);
REVOKE ALL ON {schema}.prune_marks FROM PUBLIC;

-- Whether the current transaction is the prune's: it inserted its id
-- into prune_marks. A transaction with no id yet (it wrote nothing) is
-- not; pg_current_xact_id_if_assigned() does not give it one.
CREATE FUNCTION {schema}.prune_marked() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.prune_marks WHERE txid = pg_current_xact_id_if_assigned())
$$;

-- A delete on the prune path only; never a TRUNCATE. Shared by the four
-- tables.
CREATE FUNCTION {schema}.record_guard_delete() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF NOT {schema}.prune_marked() THEN
        RAISE EXCEPTION 'arbor: a row of %.% is deleted only by the prune', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'AB006';
    END IF;
    RETURN OLD;
END
$guard$;

CREATE FUNCTION {schema}.record_guard_truncate() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: the % table cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'AB006';
END
$guard$;

-- The log is append-only: an entry, once written, never changes.
CREATE FUNCTION {schema}.log_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: log entry % is never changed (the log is append-only)', OLD.seq
        USING ERRCODE = 'AB009';
END
$guard$;

CREATE TRIGGER log_guard BEFORE UPDATE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_guard();
CREATE TRIGGER log_guard_delete BEFORE DELETE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER log_guard_truncate BEFORE TRUNCATE ON {schema}.conversation_log
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- An event is inserted by an emit (undelivered, stamped now) or by a fork
-- as a copy (it names a forked task: the copy of the task it was
-- addressed or delivered to); it changes once, when it is delivered: to
-- the task it is addressed to (or, addressed to the conversation, to any
-- of its tasks), which is parked in an await of its name (the delivery
-- comes before the task's wake, in the same transaction), stamped now.
-- Nothing else of it ever changes.
CREATE FUNCTION {schema}.event_guard() RETURNS trigger
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

CREATE TRIGGER event_guard BEFORE INSERT OR UPDATE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
CREATE TRIGGER event_guard_delete BEFORE DELETE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER event_guard_truncate BEFORE TRUNCATE ON {schema}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- A budget is inserted with nothing carried, stamped now (what its scope
-- spent and holds already is counted by the insert itself); its scope
-- and counter never change; its spend only grows (a reservation's close,
-- a spend); carried grows only on the prune path (the spend of the pruned
-- tasks' reservations, carried into the conversation's budget). Its max
-- and action are the user's to set (SetBudget).
CREATE FUNCTION {schema}.budget_guard() RETURNS trigger
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

CREATE TRIGGER budget_guard BEFORE INSERT OR UPDATE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();
CREATE TRIGGER budget_guard_delete BEFORE DELETE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER budget_guard_truncate BEFORE TRUNCATE ON {schema}.budgets
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- A reservation is made by a run of its task (the task running, with the
-- reservation's token), stamped now, open or (a spend) closed at once;
-- it changes once, when it is closed (a record, or in full, lapsed, once
-- its run is over; the record is fenced by the close itself, not by the
-- run still holding the task: core.RecordBudget). Nothing else of it
-- ever changes.
CREATE FUNCTION {schema}.reservation_guard() RETURNS trigger
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

CREATE TRIGGER reservation_guard BEFORE INSERT OR UPDATE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();
CREATE TRIGGER reservation_guard_delete BEFORE DELETE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER reservation_guard_truncate BEFORE TRUNCATE ON {schema}.budget_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();
