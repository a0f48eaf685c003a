DROP INDEX {schema}.conversations_holder_idx;
CREATE INDEX conversations_holder_idx ON {schema}.conversations (holder) WHERE holder IS NOT NULL;
ALTER TABLE {schema}.conversations DROP COLUMN holder_id;
DROP TABLE {schema}.holders;
