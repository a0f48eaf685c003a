DROP TRIGGER fork_wait_guard ON {schema}.tasks;
DROP FUNCTION {schema}.fork_wait_guard();
