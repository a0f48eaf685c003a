-- The statements internal/store/node_claim.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- A node's claims: set-based, over every conversation of a batch (node.go).
--
-- The generation rule, for a pending task t: children, and
-- roots that are not generations (kinds outside $gen, when $gen is not
-- null), start freely; a root that is a generation starts if it is under way
-- already (started before: woken or requeued), or if no other live
-- generation of its conversation is under way or older. At most one live
-- generation of a conversation runs at a time, oldest first.


-- The claims of a node: in the conversations given ($2), or in all it holds.
-- Two stages, so that the plan does not depend on statistics: the candidates
-- are found from the conversations (by the index of each conversation's live
-- tasks, or of the holder's conversations), the generation rule applied,
-- oldest first; then each is locked, with its conversation share-locked as
-- held by $1, both skipping rows another transaction holds, and checked
-- again as locked.
--
-- A node's claim (ClaimIn, and ClaimHeld over every held conversation).
-- Its shape fixes the plan: each conversation's pending tasks are read by
-- the index of its live tasks (a lateral subquery, run per conversation),
-- and the candidates are then locked by primary key. The holder's test is
-- made on the locked rows, in the UPDATE, not in the lock: in the lock it
-- had no estimate but PostgreSQL's default (0.5 % of the conversations),
-- so over tables not yet analyzed the lock was planned as a scan of every
-- conversation the holder holds, each probed for its tasks — 446 loops for
-- 105 candidates in bench (f), growing with what the node holds, not with
-- what it claims (TestClaimInAFewOfManyHeldKeepsItsPlan). The candidates
-- come from conversations this transaction has locked as held (or, for
-- ClaimHeld, from the holder's own), so the lock takes nothing of another
-- node's; one that is not held is locked and left, never claimed.
--
-- The status and holder tests are written so that no other index can
-- serve them, whatever the statistics say: statistics over a settled
-- history (nothing pending, no conversation held, analyzed between runs)
-- planned the lateral as a scan of the whole pending index per
-- conversation, and the lock as a scan of every pending task joined to
-- every conversation of the holder — pending × held rows per claim (bench
-- (l): 415 µs of server CPU per task after 30,000 settled tasks, 2,546
-- after 1,000,000, against 88 fresh). "status IN ({live}) AND status IS
-- NOT DISTINCT FROM 'pending'" is status = 'pending' (status is never
-- NULL) that proves the live index's predicate but not the pending
-- index's; IS NOT DISTINCT FROM no index serves, and the holder is never
-- NULL on the side of $1. TestClaimKeepsItsPlanAfterASettledHistory
-- keeps it so.
--
-- A claim is refused by the database once its holder's row has expired
-- (the fence on the node's own clock stops it first; this is for the
-- claim sent by a process resumed from a freeze before its fence fired,
-- whose run the taker would have counted as a restart).
--
-- The candidates are shared among tenants by weight (docs/design.md §3.15):
-- numbered within their tenant in queue order (queue_at: created_at less
-- the priority's aging), a candidate of rank r (from 1) of a tenant of
-- weight w that has b runs in flight on the node ($8, $9: tenants and their
-- runs) comes at (b + r - 1) / w, and the claim takes them in that order,
-- ties in queue order. What a full concurrency
-- limit holds back, or a queue's expiry ended, is not a candidate
-- ({startable}).
--
-- ClaimIn starts up to limit pending tasks of the conversations convs that
-- holder holds, of kinds (nil: any), by the generation rule for generation
-- kinds gen (nil: every root is a generation), fairly across tenants and in
-- queue order within one, each with its own token and the conversation's
-- epoch. It returns the runs' rows (the run
-- columns), in no particular order, and the transaction's id (0 when it
-- claimed nothing).
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of t, c), skipping rows
-- another transaction holds; row locks on what it writes (updates tasks;
-- inserts into conversation_log), held until the transaction ends.
-- name: ClaimIn
WITH w AS (WITH cand AS MATERIALIZED (
        SELECT x.id FROM (
            SELECT t.id, t.tenant, t.queue_at, row_number() OVER (PARTITION BY t.tenant ORDER BY t.queue_at, t.id) AS rn
            FROM (SELECT DISTINCT unnest($2::text[]) AS id) cv
            CROSS JOIN LATERAL (
            SELECT t.id, t.tenant, t.queue_at FROM {schema}.tasks t
            WHERE t.conversation_id = cv.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
              AND NOT t.abort_requested
              AND ($3::text[] IS NULL OR t.kind = ANY($3))
              AND (t.owner_task_id IS NOT NULL
    OR ($4::text[] IS NOT NULL AND NOT (t.kind = ANY($4::text[])))
    OR t.started_at IS NOT NULL
    OR NOT EXISTS (SELECT 1 FROM {schema}.tasks r
        WHERE r.conversation_id = t.conversation_id AND r.owner_task_id IS NULL AND r.id <> t.id
          AND r.status IN ({live})
          AND ($4::text[] IS NULL OR r.kind = ANY($4::text[]))
          AND (r.started_at IS NOT NULL OR r.id < t.id)))
              AND {startable}
            ORDER BY t.queue_at, t.id LIMIT $5) t) x
        ORDER BY (x.rn - 1 + coalesce((SELECT b.n FROM unnest($8::text[], $9::int[]) b(tenant, n) WHERE b.tenant = x.tenant LIMIT 1), 0))::float8 / {weight},
            x.queue_at, x.id LIMIT $5),
    picked AS (
        SELECT t.id AS picked_id, c.epoch AS picked_epoch, c.holder_id AS picked_holder FROM {schema}.tasks t
        JOIN {schema}.conversations c ON c.id = t.conversation_id
        WHERE t.id = ANY(ARRAY(SELECT id FROM cand))
          AND t.status IS NOT DISTINCT FROM 'pending' AND NOT t.abort_requested
          AND EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = $1::bigint AND h.expires_at > now())
        FOR NO KEY UPDATE OF t, c SKIP LOCKED)
    UPDATE {schema}.tasks t SET status = $6, token = nextval('{schema}.task_token_seq'::regclass), run_epoch = picked.picked_epoch,
        started_at = coalesce(started_at, now()),
        lease_expires_at = now() + $7 * interval '1 microsecond', updated_at = now()
    FROM picked WHERE t.id = picked.picked_id AND picked.picked_holder IS NOT DISTINCT FROM $1::bigint
    RETURNING t.*),
logged AS ({log_status})
SELECT {run_columns}, pg_current_xact_id()::text::bigint FROM w ORDER BY id;

-- ClaimHeld is ClaimIn across every conversation holder holds.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of t, c), skipping rows
-- another transaction holds; row locks on what it writes (updates tasks;
-- inserts into conversation_log), held until the transaction ends.
-- name: ClaimHeld
WITH w AS (WITH cand AS MATERIALIZED (
        SELECT x.id FROM (
            SELECT t.id, t.tenant, t.queue_at, row_number() OVER (PARTITION BY t.tenant ORDER BY t.queue_at, t.id) AS rn
            FROM (SELECT c.id FROM {schema}.conversations c WHERE c.holder_id = $1 AND $2::text[] IS NULL) cv
            CROSS JOIN LATERAL (
            SELECT t.id, t.tenant, t.queue_at FROM {schema}.tasks t
            WHERE t.conversation_id = cv.id AND t.status IN ({live}) AND t.status IS NOT DISTINCT FROM 'pending'
              AND NOT t.abort_requested
              AND ($3::text[] IS NULL OR t.kind = ANY($3))
              AND (t.owner_task_id IS NOT NULL
    OR ($4::text[] IS NOT NULL AND NOT (t.kind = ANY($4::text[])))
    OR t.started_at IS NOT NULL
    OR NOT EXISTS (SELECT 1 FROM {schema}.tasks r
        WHERE r.conversation_id = t.conversation_id AND r.owner_task_id IS NULL AND r.id <> t.id
          AND r.status IN ({live})
          AND ($4::text[] IS NULL OR r.kind = ANY($4::text[]))
          AND (r.started_at IS NOT NULL OR r.id < t.id)))
              AND {startable}
            ORDER BY t.queue_at, t.id LIMIT $5) t) x
        ORDER BY (x.rn - 1 + coalesce((SELECT b.n FROM unnest($8::text[], $9::int[]) b(tenant, n) WHERE b.tenant = x.tenant LIMIT 1), 0))::float8 / {weight},
            x.queue_at, x.id LIMIT $5),
    picked AS (
        SELECT t.id AS picked_id, c.epoch AS picked_epoch, c.holder_id AS picked_holder FROM {schema}.tasks t
        JOIN {schema}.conversations c ON c.id = t.conversation_id
        WHERE t.id = ANY(ARRAY(SELECT id FROM cand))
          AND t.status IS NOT DISTINCT FROM 'pending' AND NOT t.abort_requested
          AND EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = $1::bigint AND h.expires_at > now())
        FOR NO KEY UPDATE OF t, c SKIP LOCKED)
    UPDATE {schema}.tasks t SET status = $6, token = nextval('{schema}.task_token_seq'::regclass), run_epoch = picked.picked_epoch,
        started_at = coalesce(started_at, now()),
        lease_expires_at = now() + $7 * interval '1 microsecond', updated_at = now()
    FROM picked WHERE t.id = picked.picked_id AND picked.picked_holder IS NOT DISTINCT FROM $1::bigint
    RETURNING t.*),
logged AS ({log_status})
SELECT {run_columns}, pg_current_xact_id()::text::bigint FROM w ORDER BY id;
