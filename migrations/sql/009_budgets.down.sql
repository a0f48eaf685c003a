DROP TABLE {schema}.budget_reservations;
DROP TABLE {schema}.budgets;
