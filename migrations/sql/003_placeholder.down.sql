-- PLACEHOLDER, DROP AT MERGE (see 003_placeholder.up.sql).
SELECT 1;
