-- The conversation lease's holder gets its own name (a task's owner is the
-- task that created it), and a running task records the lease epoch its run
-- started under, so that the checker can tell a run fenced by the current
-- lease from one left behind by a take-over (docs/design.md §4, invariant 8).
ALTER TABLE {schema}.conversations RENAME COLUMN owner TO holder;
ALTER TABLE {schema}.tasks ADD COLUMN run_epoch bigint;
-- Conversations whose lease a node can take: free, or expired.
CREATE INDEX conversations_lease_idx ON {schema}.conversations (lease_expires_at) WHERE holder IS NOT NULL;
