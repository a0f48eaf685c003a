DROP TRIGGER "Arbor_reservation_guard_delete" ON {schema}.budget_reservations;
CREATE TRIGGER reservation_guard_delete BEFORE DELETE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
DROP TRIGGER "Arbor_reservation_guard_update" ON {schema}.budget_reservations;
DROP TRIGGER reservation_guard ON {schema}.budget_reservations;
CREATE TRIGGER reservation_guard BEFORE INSERT OR UPDATE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();

DROP TRIGGER "Arbor_budget_guard_delete" ON {schema}.budgets;
CREATE TRIGGER budget_guard_delete BEFORE DELETE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
DROP TRIGGER "Arbor_budget_guard_update" ON {schema}.budgets;
DROP TRIGGER budget_guard ON {schema}.budgets;
CREATE TRIGGER budget_guard BEFORE INSERT OR UPDATE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();

DROP TRIGGER "Arbor_log_guard_delete" ON {schema}.conversation_log;
CREATE TRIGGER log_guard_delete BEFORE DELETE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
DROP TRIGGER "Arbor_log_guard" ON {schema}.conversation_log;
CREATE TRIGGER log_guard BEFORE UPDATE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_guard();

DROP TRIGGER "Arbor_event_guard_delete" ON {schema}.events;
CREATE TRIGGER event_guard_delete BEFORE DELETE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
DROP TRIGGER "Arbor_event_guard_update" ON {schema}.events;
DROP TRIGGER event_guard ON {schema}.events;
CREATE TRIGGER event_guard BEFORE INSERT OR UPDATE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
