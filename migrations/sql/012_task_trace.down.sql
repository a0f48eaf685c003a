ALTER TABLE {schema}.tasks DROP COLUMN trace;
