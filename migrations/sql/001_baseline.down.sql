-- Removes everything 001_baseline.up.sql creates. Dropping a table drops
-- its indexes and triggers; the functions and sequences go after.
DROP TABLE {schema}.prune_marks;
DROP TABLE {schema}.budget_reservations;
DROP TABLE {schema}.budgets;
DROP TABLE {schema}.conversation_log;
DROP SEQUENCE {schema}.log_seq;
DROP TABLE {schema}.events;
DROP TABLE {schema}.tasks;
DROP SEQUENCE {schema}.task_settle_seq;
DROP SEQUENCE {schema}.task_token_seq;
DROP TABLE {schema}.conversations;
DROP TABLE {schema}.maintenance_leader;
DROP TABLE {schema}.holders;

DROP FUNCTION {schema}.task_guard();
DROP FUNCTION {schema}.task_guard_truncate();
DROP FUNCTION {schema}.conversation_guard();
DROP FUNCTION {schema}.conversation_handover_guard();
DROP FUNCTION {schema}.record_guard_delete();
DROP FUNCTION {schema}.record_guard_truncate();
DROP FUNCTION {schema}.event_guard();
DROP FUNCTION {schema}.log_guard();
DROP FUNCTION {schema}.budget_guard();
DROP FUNCTION {schema}.reservation_guard();
DROP FUNCTION {schema}.holder_guard();
DROP FUNCTION {schema}.prune_mark_guard();
DROP FUNCTION {schema}.budget_reserve;
DROP FUNCTION {schema}.budget_record;
DROP FUNCTION {schema}.budget_sums_guard();
DROP FUNCTION {schema}.reservation_sums_guard();
DROP FUNCTION {schema}.fork_wait_guard();
DROP FUNCTION {schema}.log_guard_insert();
DROP FUNCTION {schema}.prune_marked();
