-- The record guards (migration 019) check updates and deletes after the
-- row is written, as the tasks' and conversations' guard does since
-- migration 022: a BEFORE UPDATE or BEFORE DELETE row trigger locks each
-- row it is given, one WAL record per row (a budget charged by every
-- reservation, an event delivered, each entry the prune deletes). A raise
-- undoes the statement just the same. Inserts stay checked before the row
-- is written. The capital A orders each guard before a foreign key's
-- triggers ("RI_ConstraintTrigger_…"), so that a forgery is refused by the
-- guard's code.
DROP TRIGGER event_guard ON {schema}.events;
CREATE TRIGGER event_guard BEFORE INSERT ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
CREATE TRIGGER "Arbor_event_guard_update" AFTER UPDATE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
DROP TRIGGER event_guard_delete ON {schema}.events;
CREATE TRIGGER "Arbor_event_guard_delete" AFTER DELETE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();

DROP TRIGGER log_guard ON {schema}.conversation_log;
CREATE TRIGGER "Arbor_log_guard" AFTER UPDATE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_guard();
DROP TRIGGER log_guard_delete ON {schema}.conversation_log;
CREATE TRIGGER "Arbor_log_guard_delete" AFTER DELETE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();

DROP TRIGGER budget_guard ON {schema}.budgets;
CREATE TRIGGER budget_guard BEFORE INSERT ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();
CREATE TRIGGER "Arbor_budget_guard_update" AFTER UPDATE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();
DROP TRIGGER budget_guard_delete ON {schema}.budgets;
CREATE TRIGGER "Arbor_budget_guard_delete" AFTER DELETE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();

DROP TRIGGER reservation_guard ON {schema}.budget_reservations;
CREATE TRIGGER reservation_guard BEFORE INSERT ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();
CREATE TRIGGER "Arbor_reservation_guard_update" AFTER UPDATE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();
DROP TRIGGER reservation_guard_delete ON {schema}.budget_reservations;
CREATE TRIGGER "Arbor_reservation_guard_delete" AFTER DELETE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
