-- Removes what 003_schedules.up.sql adds.
DROP TABLE {schema}.schedules;
