-- The statements internal/store/budget.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Budgets and their reservations (internal/core/budget.go).


-- The reserving task, share-locked: no take-over or settle of it commits
-- while a reservation is made for its run.
--
-- RunTask share-locks the reserving task and reads what a reservation checks
-- of it.
--
-- Locks: FOR SHARE on the rows it selects, held until the transaction ends.
-- name: RunTask
SELECT conversation_id, status, coalesce(token, 0), tenant FROM {schema}.tasks WHERE id = $1 AND conversation_id = $2 FOR SHARE;

-- A task and its owners up to the root, the task first: a walk up, one
-- primary-key probe per step whatever the statistics (see tree.go, the walks
-- up).
--
-- ScopeChain reads task taskID and its owners up to the root, the task
-- first.
--
-- Locks: none (a read).
-- name: ScopeChain
WITH RECURSIVE chain (id, owner_task_id, created_at, depth) AS (
    SELECT id, owner_task_id, created_at, 0 FROM {schema}.tasks WHERE conversation_id = $1 AND id = $2
    UNION ALL
    SELECT o.id, o.owner_task_id, o.created_at, c.depth + 1 FROM chain c CROSS JOIN LATERAL (
        SELECT o.id, o.owner_task_id, o.created_at FROM {schema}.tasks o
        WHERE o.conversation_id = $1 AND o.id = c.owner_task_id OFFSET 0) o)
SELECT id, created_at, now() FROM chain ORDER BY depth;

-- ConversationCreated reads when a conversation was created.
--
-- Locks: none (a read).
-- name: ConversationCreated
SELECT created_at FROM {schema}.conversations WHERE id = $1;

-- Every budget of the conversation for the counters $2, locked in one order
-- (counter, then scope; the conversation's first) by every writer, so
-- reservations of one counter in one conversation queue on the
-- conversation's row.
--
-- LockBudgets locks every budget of conv for the counters, in the one order
-- every writer uses.
--
-- Locks: FOR UPDATE on the rows it selects, held until the transaction ends.
-- name: LockBudgets
SELECT conversation_id, coalesce(task_id, 0), counter, coalesce(max, 9223372036854775807), spent, reserved,
carried, on_exhausted, updated_at FROM {schema}.budgets
    WHERE conversation_id = $1 AND counter = ANY($2)
    ORDER BY counter, coalesce(task_id, 0) FOR UPDATE;

-- ReadBudgets reads, without locking, every budget of conv for the counters.
--
-- Locks: none (a read).
-- name: ReadBudgets
SELECT conversation_id, coalesce(task_id, 0), counter, coalesce(max, 9223372036854775807), spent, reserved,
carried, on_exhausted, updated_at FROM {schema}.budgets
    WHERE conversation_id = $1 AND counter = ANY($2)
    ORDER BY counter, coalesce(task_id, 0);

-- A wall-time budget's spend is the time since its scope's creation.
--
-- ConversationBudgets reads every budget of a conversation.
--
-- Locks: none (a read).
-- name: ConversationBudgets
SELECT b.conversation_id, coalesce(b.task_id, 0), b.counter,
    coalesce(b.max, 9223372036854775807),
    CASE WHEN b.counter = 'wall_ms'
        THEN (extract(epoch FROM now() - coalesce(t.created_at, c.created_at)) * 1000)::bigint
        ELSE b.spent END,
    b.reserved, b.carried, b.on_exhausted, b.updated_at
FROM {schema}.budgets b
JOIN {schema}.conversations c ON c.id = b.conversation_id
LEFT JOIN {schema}.tasks t ON t.conversation_id = b.conversation_id AND t.id = b.task_id
WHERE b.conversation_id = $1 ORDER BY coalesce(b.task_id, 0), b.counter;

-- A new budget counts what its scope's subtree has spent and holds already:
-- a budget set late is as exact as one set at the start.
--
-- InsertBudget creates a budget counting its scope's spend so far; ok is
-- false when the scope has one for the counter already.
--
-- Locks: row locks on what it writes (inserts into budgets), held until the
-- transaction ends.
-- name: InsertBudget
WITH RECURSIVE sub (id) AS (
        SELECT id FROM {schema}.tasks WHERE conversation_id = $1 AND id = $2
        UNION ALL
        SELECT t.id FROM sub s CROSS JOIN LATERAL (SELECT t.id FROM {schema}.tasks t
            WHERE t.conversation_id = $1 AND t.owner_task_id = s.id OFFSET 0) t),
    so_far AS (
        SELECT coalesce(sum(r.actual), 0) AS spent, coalesce(sum(r.amount) FILTER (WHERE r.actual IS NULL), 0) AS reserved
        FROM {schema}.budget_reservations r
        WHERE r.conversation_id = $1 AND r.counter = $3 AND ($2 = 0 OR r.task_id IN (SELECT id FROM sub)))
    INSERT INTO {schema}.budgets (conversation_id, task_id, counter, max, on_exhausted, spent, reserved)
    SELECT $1, nullif($2::bigint, 0), $3, $4, $5, so_far.spent, so_far.reserved FROM so_far
    ON CONFLICT (conversation_id, counter, (coalesce(task_id, 0))) DO NOTHING
    RETURNING conversation_id, coalesce(task_id, 0), counter, coalesce(max, 9223372036854775807), spent, reserved,
carried, on_exhausted, updated_at;

-- UpdateBudget sets a budget's maximum and action.
--
-- Locks: row locks on what it writes (updates budgets), held until the
-- transaction ends.
-- name: UpdateBudget
UPDATE {schema}.budgets SET max = $4, on_exhausted = $5, updated_at = now()
    WHERE conversation_id = $1 AND counter = $3 AND coalesce(task_id, 0) = $2
    RETURNING conversation_id, coalesce(task_id, 0), counter, coalesce(max, 9223372036854775807), spent, reserved,
carried, on_exhausted, updated_at;

-- Moves amount $4 of held reservation into spend $5 on the scopes $3 (a
-- chain, the conversation's 0 included).
--
-- ChargeBudgets moves held from reserved to spent as spent on the scopes
-- (task ids, 0 for the conversation) of one counter.
--
-- Locks: row locks on what it writes (updates budgets), held until the
-- transaction ends.
-- name: ChargeBudgets
UPDATE {schema}.budgets
SET reserved = reserved - $4, spent = spent + $5, updated_at = now()
WHERE conversation_id = $1 AND counter = $2 AND coalesce(task_id, 0) = ANY($3);

-- The common path of a reservation, or a spend, in one statement (migration
-- 027's budget_reserve; see ReserveAtOnce).
--
-- ReserveAtOnce makes r (a reservation of r.Amount of r.Counter for the run
-- r.RunToken of task r.TaskID, keyed r.IdempotencyKey; closed at once with
-- spend) in one statement when it is on the common path: the task
-- share-locked, the counter's and wall time's budgets locked in the one
-- order, checked, charged, the reservation inserted. Run outside a
-- transaction it commits on its own.
--
-- Locks (in budget_reserve): FOR SHARE on the task; FOR UPDATE on the
-- conversation's budgets of the counter and of wall time, in (counter,
-- task) order; row locks on what it writes (updates budgets; inserts into
-- budget_reservations), held until the transaction ends.
-- name: ReserveAtOnce
SELECT outcome, coalesce(task_status, ''), coalesce(task_token, 0),
    coalesce(r_id, 0), coalesce(r_conversation, ''), coalesce(r_task, 0), coalesce(r_counter, ''), coalesce(r_token, 0),
    coalesce(r_key, ''), coalesce(r_amount, 0), r_actual, coalesce(r_lapsed, false)
FROM {schema}.budget_reserve($1, $2, $3, $4, $5, $6, $7);

-- A record in one statement (the schema baseline's budget_record; see
-- RecordAtOnce).
--
-- RecordAtOnce closes reservation id of task taskID with actual in one
-- statement: the counter's budgets locked, the reservation read again under
-- them, closed, and charged to the budgets above the task.
--
-- Locks (in budget_record): FOR UPDATE on the conversation's budgets of the
-- reservation's counter, in (counter, task) order; row locks on what it
-- writes (updates budget_reservations, budgets), held until the transaction
-- ends.
-- name: RecordAtOnce
SELECT outcome, '', 0::bigint,
    coalesce(r_id, 0), coalesce(r_conversation, ''), coalesce(r_task, 0), coalesce(r_counter, ''), coalesce(r_token, 0),
    coalesce(r_key, ''), coalesce(r_amount, 0), r_actual, coalesce(r_lapsed, false)
FROM {schema}.budget_record($1, $2, $3, $4);

-- ReservationByKey reads a task's reservation by its idempotency key.
--
-- Locks: none (a read).
-- name: ReservationByKey
SELECT id, conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, lapsed FROM {schema}.budget_reservations
WHERE conversation_id = $1 AND task_id = $2 AND idempotency_key = $3;

-- InsertReservation records a reservation; with actual not nil it is closed
-- at once (a spend). $8 are the tenant budgets it charged.
--
-- Locks: row locks on what it writes (inserts into budget_reservations),
-- held until the transaction ends.
-- name: InsertReservation
INSERT INTO {schema}.budget_reservations
    (conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, closed_at, tenant_budgets)
VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7::bigint IS NULL THEN NULL ELSE now() END, $8)
RETURNING id, conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, lapsed;

-- CloseReservation closes an open reservation; false when it was closed.
--
-- Locks: row locks on what it writes (updates budget_reservations), held
-- until the transaction ends.
-- name: CloseReservation
UPDATE {schema}.budget_reservations SET actual = $3, lapsed = $4, closed_at = now()
WHERE conversation_id = $1 AND id = $2 AND actual IS NULL;

-- The open reservations of a counter in a conversation, each with whether
-- its run is over.
--
-- OpenReservations reads the open reservations of a counter in a
-- conversation, each with whether its run is over.
--
-- Locks: none (a read).
-- name: OpenReservations
SELECT r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key,
    r.amount, r.actual, r.lapsed, NOT (t.status = 'running' AND t.token IS NOT DISTINCT FROM r.run_token),
    r.tenant_budgets
FROM {schema}.budget_reservations r
JOIN {schema}.tasks t ON t.conversation_id = r.conversation_id AND t.id = r.task_id
WHERE r.conversation_id = $1 AND r.counter = $2 AND r.actual IS NULL
ORDER BY r.id;

-- Spend by task: what each task recorded and holds, per counter.
--
-- SpendByTask reads each task's own spend in a conversation.
--
-- Locks: none (a read).
-- name: SpendByTask
SELECT task_id, counter, coalesce(sum(actual), 0), coalesce(sum(amount) FILTER (WHERE actual IS NULL), 0)
FROM {schema}.budget_reservations WHERE conversation_id = $1
GROUP BY task_id, counter ORDER BY task_id, counter;

-- Across conversations (a maintenance scan, like the deadline scan):
-- counters of conversations with a reservation whose run is over.
--
-- LapsedReservations lists up to limit (conversation, counter) pairs with a
-- reservation whose run is over.
--
-- Locks: none (a read).
-- name: LapsedReservations
SELECT DISTINCT r.conversation_id, r.counter
FROM {schema}.budget_reservations r
JOIN {schema}.tasks t ON t.conversation_id = r.conversation_id AND t.id = r.task_id
WHERE r.actual IS NULL AND NOT (t.status = 'running' AND t.token IS NOT DISTINCT FROM r.run_token)
LIMIT $1;

-- Across conversations: live tasks under a "fail" wall-time budget that is
-- over — the budget's task, or a conversation's live roots.
--
-- OverWallTime lists up to limit live tasks under a "fail" wall-time budget
-- that is over.
--
-- Locks: none (a read).
-- name: OverWallTime
SELECT t.id FROM {schema}.budgets b
JOIN {schema}.conversations c ON c.id = b.conversation_id
JOIN {schema}.tasks t ON t.conversation_id = b.conversation_id
    AND (t.id = b.task_id OR (b.task_id IS NULL AND t.owner_task_id IS NULL))
WHERE b.counter = 'wall_ms' AND b.max IS NOT NULL AND b.on_exhausted = 'fail'
    AND t.status IN ({live})
    AND (CASE WHEN b.task_id IS NULL THEN c.created_at ELSE t.created_at END) + b.max * interval '1 millisecond' <= now()
ORDER BY t.id LIMIT $1;

-- Tenant budgets (migration 004; docs/design.md §3.11): a counter across
-- every conversation of a tenant, with an optional calendar window in UTC.
-- They come last in every lock order.

-- The columns every statement below returns of a tenant budget, with the
-- database's clock.
--
-- LockTenantBudgets locks the tenant's budgets of the counter, by id,
-- rolling over those whose window is over (tenant_budgets_lock), and reads
-- them as they then stand.
--
-- Locks: FOR UPDATE on the tenant's budgets of the counter (by id, in
-- tenant_budgets_lock); row locks on what it writes (updates tenant_budgets
-- whose window rolled over), held until the transaction ends.
-- name: LockTenantBudgets
SELECT b.id, b.tenant, b.counter, b.window_unit, b.window_start, coalesce(b.max, 9223372036854775807), b.spent, b.reserved,
    b.on_exhausted, b.updated_at, now()
FROM {schema}.tenant_budgets b WHERE b.id = ANY({schema}.tenant_budgets_lock($1, $2)) ORDER BY b.id;

-- A window over and not yet rolled over reads as the writers will roll
-- it: the current window, nothing spent in it.
--
-- ReadTenantBudgets reads, without locking, the tenant's budgets of the
-- counters $2 (all of them when $2 is null), each window as it stands now.
--
-- Locks: none (a read).
-- name: ReadTenantBudgets
SELECT b.id, b.tenant, b.counter, b.window_unit,
    CASE WHEN b.window_unit <> '' AND date_trunc(b.window_unit, now(), 'UTC') > b.window_start
        THEN date_trunc(b.window_unit, now(), 'UTC') ELSE b.window_start END,
    coalesce(b.max, 9223372036854775807),
    CASE WHEN b.window_unit <> '' AND date_trunc(b.window_unit, now(), 'UTC') > b.window_start THEN 0 ELSE b.spent END,
    b.reserved, b.on_exhausted, b.updated_at, now()
FROM {schema}.tenant_budgets b WHERE b.tenant = $1 AND ($2::text[] IS NULL OR b.counter = ANY($2))
ORDER BY b.counter, b.id;

-- Tenant budget writers queue here first (SetBudget of a tenant), before
-- the conversations they lock: nothing else takes this lock.
--
-- LockTenantBudgetWriters takes the transaction's advisory lock of the
-- tenant's budget writers in this schema.
--
-- Locks: an advisory lock (pg_advisory_xact_lock) of ('{schema}', tenant),
-- held until the transaction ends.
-- name: LockTenantBudgetWriters
SELECT pg_advisory_xact_lock(hashtextextended('arbor.tenant_budgets:{schema}:' || $1, 0));

-- The conversations in which a task may park on a budget, locked in
-- ascending id as a raise's lock order says.
--
-- LockTenantLiveConversations locks every conversation of the tenant that
-- has a live task, in ascending id (as every locker of many conversations
-- does), and returns their ids.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), held until the
-- transaction ends.
-- name: LockTenantLiveConversations
SELECT c.id FROM {schema}.conversations c
WHERE c.tenant = $1 AND EXISTS (SELECT FROM {schema}.tasks t WHERE t.conversation_id = c.id AND t.status IN ({live}))
ORDER BY c.id FOR NO KEY UPDATE OF c;

-- A new tenant budget counts from now, in the current window.
--
-- InsertTenantBudget creates a tenant budget; no row when the tenant has
-- one of the counter and window already.
--
-- Locks: row locks on what it writes (inserts into tenant_budgets), held
-- until the transaction ends.
-- name: InsertTenantBudget
INSERT INTO {schema}.tenant_budgets (tenant, counter, window_unit, window_start, max, on_exhausted)
VALUES ($1, $2, $3, CASE WHEN $3 = '' THEN NULL ELSE date_trunc($3, now(), 'UTC') END, $4, $5)
ON CONFLICT (tenant, counter, window_unit) DO NOTHING
RETURNING id, tenant, counter, window_unit, window_start, coalesce(max, 9223372036854775807), spent, reserved,
    on_exhausted, updated_at, now();

-- UpdateTenantBudget sets a tenant budget's maximum and action.
--
-- Locks: row locks on what it writes (updates tenant_budgets), held until
-- the transaction ends.
-- name: UpdateTenantBudget
UPDATE {schema}.tenant_budgets SET max = $2, on_exhausted = $3, updated_at = now() WHERE id = $1
RETURNING id, tenant, counter, window_unit, window_start, coalesce(max, 9223372036854775807), spent, reserved,
    on_exhausted, updated_at, now();

-- ChargeTenantBudgets moves held from reserved to spent as spent on the
-- tenant budgets $1 (locked by LockTenantBudgets before).
--
-- Locks: row locks on what it writes (updates tenant_budgets), held until
-- the transaction ends.
-- name: ChargeTenantBudgets
UPDATE {schema}.tenant_budgets SET reserved = reserved - $2, spent = spent + $3, updated_at = now()
WHERE id = ANY($1);

-- ConversationTenant reads a conversation's tenant.
--
-- Locks: none (a read).
-- name: ConversationTenant
SELECT tenant FROM {schema}.conversations WHERE id = $1;
