-- The node runner's statements (package machine): a node's claim across the
-- conversations it holds starts from this index.
CREATE INDEX conversations_holder_idx ON {schema}.conversations (holder) WHERE holder IS NOT NULL;
-- Live children are looked up by their owner: a root (no owner) has no
-- place in that index, and every change of a root's status would add an
-- entry nobody reads. (With roots in it, a young table's statistics made
-- the generation rule's look-up of a conversation's live roots scan every
-- live root of every conversation through it; without them, that look-up
-- takes tasks_conversation_live_idx.)
DROP INDEX {schema}.tasks_live_children_idx;
CREATE INDEX tasks_live_children_idx ON {schema}.tasks (owner_task_id)
    WHERE owner_task_id IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- A node renews every lease it holds every third of the lease: without an
-- index on lease_expires_at (and with room left on each page) a renewal is
-- a HOT update, with no index entry to add. Expired leases are found through
-- conversations_holder_idx instead, on the slow poll.
DROP INDEX {schema}.conversations_lease_idx;
ALTER TABLE {schema}.conversations SET (fillfactor = 70);
