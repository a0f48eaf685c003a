DROP TRIGGER task_guard ON {schema}.tasks;
DROP FUNCTION {schema}.task_guard();
