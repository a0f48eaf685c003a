DROP INDEX {schema}.conversations_lease_idx;
ALTER TABLE {schema}.tasks DROP COLUMN run_epoch;
ALTER TABLE {schema}.conversations RENAME COLUMN holder TO owner;
