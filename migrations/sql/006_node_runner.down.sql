ALTER TABLE {schema}.conversations RESET (fillfactor);
CREATE INDEX conversations_lease_idx ON {schema}.conversations (lease_expires_at) WHERE holder IS NOT NULL;
DROP INDEX {schema}.tasks_live_children_idx;
CREATE INDEX tasks_live_children_idx ON {schema}.tasks (owner_task_id)
    WHERE status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
DROP INDEX {schema}.conversations_holder_idx;
