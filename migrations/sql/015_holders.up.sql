-- Holders and their leases (docs/design.md §3.8; package machine's doc). A
-- holder — a runner's node, or one machine.Lease — is one row here, a life:
-- it holds every conversation that names it (conversations.holder_id) while
-- its deadline has not passed, and renews them all by renewing this row. No
-- statement but the holder's own renewal locks a holder's row (a take-over
-- only reads it), so a renewal never waits for a lock held on a
-- conversation, and its cost does not grow with the conversations held.
--
-- renewed_at is when the row was last renewed: a take-over of a holder
-- whose last renewal came before the server's start does not count as a
-- restart of the tasks it recovers (the restart lapsed every holder).
--
-- Runners of an earlier version renew conversations.lease_expires_at,
-- which migration 017 drops: stop every runner before migrating through
-- 017, and start the new version after. The leases held now become one
-- holder row per holder name, with the latest of its deadlines.
CREATE TABLE {schema}.holders (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> '' AND octet_length(name) <= 200),
    expires_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
-- The holder's life that holds the conversation (holder keeps its name, as
-- operators see it).
ALTER TABLE {schema}.conversations ADD COLUMN holder_id bigint REFERENCES {schema}.holders (id);
INSERT INTO {schema}.holders (name, expires_at)
    SELECT holder, max(lease_expires_at) FROM {schema}.conversations
    WHERE holder IS NOT NULL GROUP BY holder;
UPDATE {schema}.conversations c SET holder_id = h.id FROM {schema}.holders h WHERE h.name = c.holder;
-- A node's claims across the conversations it holds start from this index
-- (by its life, no longer by its name), and so do the take-overs of a
-- lapsed holder's conversations.
DROP INDEX {schema}.conversations_holder_idx;
CREATE INDEX conversations_holder_idx ON {schema}.conversations (holder_id) WHERE holder_id IS NOT NULL;
