-- Guards for what migration 019 left open (issue 24): the holders table
-- took any change written by hand, and a budget's spent and reserved any
-- raise. Each now changes only in the ways arbor changes it.
--
-- A holder row (store/lease.go: NewHolder, RenewHolder, EndHolder,
-- PruneHolders) is inserted live, stamped now; only its renewal changes
-- it, and only while it is live: its deadline never comes closer (a
-- deadline brought back by hand lapses a holder whose handlers still run,
-- and another node would take its conversations over under them) and it
-- is stamped renewed now. Its name, id and birth never change. It is
-- deleted only once no conversation names it (its own end, or the
-- maintenance prune of lives long over), and the table is never
-- truncated. Refusals raise AB009 (fsm.SQLStateRecord), a delete of a
-- holder that holds a conversation or a TRUNCATE AB006
-- (fsm.SQLStateDelete).
CREATE FUNCTION {schema}.holder_guard() RETURNS trigger
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
    RETURN NEW;
END
$guard$;

CREATE TRIGGER holder_guard BEFORE INSERT OR UPDATE OR DELETE ON {schema}.holders
    FOR EACH ROW EXECUTE FUNCTION {schema}.holder_guard();
CREATE TRIGGER holder_guard_truncate BEFORE TRUNCATE ON {schema}.holders
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- A budget's spent and reserved are the sums of its scope's reservations
-- (docs/design.md invariant 10): spent = the closed ones' actual +
-- carried, reserved = the open ones' amount. A reservation's insert or
-- close moves them, and a raise no reservation row explains is a forgery.
-- The rule is checked on the rows, not on arbor's statements: at the
-- commit of a transaction that inserted a budget or changed its spent or
-- reserved (a deferred constraint trigger), the budget's sums must agree
-- with its scope's reservations as the transaction leaves them, whatever
-- statements wrote them and in whichever order (a charge may come before
-- the reservation it charges, or in the same statement). Else the commit
-- fails with AB009. The check reads the budget's current row (a later
-- change of the same row in the transaction is checked by its own event)
-- and sums the reservations of its counter in its scope: the whole
-- conversation's for the conversation's budget, the task's subtree's
-- (walked down by primary key, as 020's walks) for a task's. Wall-time
-- budgets keep no sums and are not checked.
CREATE FUNCTION {schema}.budget_sums_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    b {schema}.budgets%ROWTYPE;
    closed bigint;
    open bigint;
BEGIN
    SELECT * INTO b FROM {schema}.budgets g WHERE g.conversation_id = NEW.conversation_id AND g.counter = NEW.counter
        AND coalesce(g.task_id, 0) = coalesce(NEW.task_id, 0);
    IF NOT FOUND OR b.spent <> NEW.spent OR b.reserved <> NEW.reserved THEN
        RETURN NULL;
    END IF;
    IF b.task_id IS NULL THEN
        SELECT coalesce(sum(r.actual), 0), coalesce(sum(r.amount) FILTER (WHERE r.actual IS NULL), 0) INTO closed, open
        FROM {schema}.budget_reservations r WHERE r.conversation_id = b.conversation_id AND r.counter = b.counter;
    ELSE
        WITH RECURSIVE sub (id) AS (
            SELECT t.id FROM {schema}.tasks t WHERE t.conversation_id = b.conversation_id AND t.id = b.task_id
            UNION ALL
            SELECT d.id FROM sub s CROSS JOIN LATERAL (SELECT t.id FROM {schema}.tasks t
                WHERE t.conversation_id = b.conversation_id AND t.owner_task_id = s.id OFFSET 0) d)
        SELECT coalesce(sum(r.actual), 0), coalesce(sum(r.amount) FILTER (WHERE r.actual IS NULL), 0) INTO closed, open
        FROM sub CROSS JOIN LATERAL (SELECT r.actual, r.amount FROM {schema}.budget_reservations r
            WHERE r.conversation_id = b.conversation_id AND r.task_id = sub.id AND r.counter = b.counter OFFSET 0) r;
    END IF;
    IF b.spent <> closed + b.carried OR b.reserved <> open THEN
        RAISE EXCEPTION 'arbor: budget % of % (task %): spent % and reserved %, but its scope''s reservations explain spent % and reserved %',
            b.counter, b.conversation_id, coalesce(b.task_id, 0), b.spent, b.reserved, closed + b.carried, open
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;

CREATE CONSTRAINT TRIGGER budget_sums_guard AFTER INSERT ON {schema}.budgets
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.counter <> 'wall_ms')
    EXECUTE FUNCTION {schema}.budget_sums_guard();
CREATE CONSTRAINT TRIGGER budget_sums_guard_update AFTER UPDATE OF spent, reserved ON {schema}.budgets
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.counter <> 'wall_ms' AND (NEW.spent <> OLD.spent OR NEW.reserved <> OLD.reserved))
    EXECUTE FUNCTION {schema}.budget_sums_guard();
