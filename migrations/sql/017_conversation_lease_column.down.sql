ALTER TABLE {schema}.conversations ADD COLUMN lease_expires_at timestamptz;
UPDATE {schema}.conversations c SET lease_expires_at = h.expires_at
    FROM {schema}.holders h WHERE h.id = c.holder_id;
