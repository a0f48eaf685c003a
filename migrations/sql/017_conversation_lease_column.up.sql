-- A conversation's lease deadline is its holder's (migration 015): the
-- column of the conversation, which every renewal used to update, goes.
ALTER TABLE {schema}.conversations DROP COLUMN lease_expires_at;
