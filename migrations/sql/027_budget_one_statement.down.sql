DROP FUNCTION {schema}.budget_record(text, bigint, bigint, bigint);
DROP FUNCTION {schema}.budget_reserve(text, bigint, bigint, text, bigint, text, boolean);
