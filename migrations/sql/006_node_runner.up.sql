-- The node runner's statements (package machine): a node's claim across the
-- conversations it holds starts from this index, and the generation rule
-- (at most one live turn of a conversation runs, oldest first) looks up a
-- conversation's live roots in the second, whatever the statistics say of
-- tables that are young or churning.
CREATE INDEX conversations_holder_idx ON {schema}.conversations (holder) WHERE holder IS NOT NULL;
CREATE INDEX tasks_live_roots_idx ON {schema}.tasks (conversation_id, id)
    WHERE owner_task_id IS NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- Live children are looked up by their owner: a root (no owner) has no
-- place in that index, and every change of a root's status would add an
-- entry nobody reads.
DROP INDEX {schema}.tasks_live_children_idx;
CREATE INDEX tasks_live_children_idx ON {schema}.tasks (owner_task_id)
    WHERE owner_task_id IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- A node renews every lease it holds every third of the lease: without an
-- index on lease_expires_at (and with room left on each page) a renewal is
-- a HOT update, with no index entry to add. Expired leases are found through
-- conversations_holder_idx instead, on the slow poll.
DROP INDEX {schema}.conversations_lease_idx;
ALTER TABLE {schema}.conversations SET (fillfactor = 70);
