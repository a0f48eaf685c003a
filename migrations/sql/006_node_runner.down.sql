DROP INDEX {schema}.tasks_live_roots_idx;
DROP INDEX {schema}.conversations_holder_idx;
