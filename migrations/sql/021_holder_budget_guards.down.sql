DROP TRIGGER budget_sums_guard_update ON {schema}.budgets;
DROP TRIGGER budget_sums_guard ON {schema}.budgets;
DROP FUNCTION {schema}.budget_sums_guard();
DROP TRIGGER holder_guard_truncate ON {schema}.holders;
DROP TRIGGER holder_guard ON {schema}.holders;
DROP FUNCTION {schema}.holder_guard();
