DROP TRIGGER "Arbor_log_guard_insert" ON {schema}.conversation_log;
DROP FUNCTION {schema}.log_guard_insert();
