-- The statements internal/store/inspect.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Queries for operators (the arbor command's ls, the web view). Unlike the
-- engine's queries they span conversations, so they read only: they take no
-- lock and are never part of an operation's transaction.
--
-- The web view's reads (package arborui). Each is bounded: it reads at most
-- a number of rows its caller chooses, in the order of an index, and pages
-- by a keyset (the last key it returned), never by OFFSET, so that a page
-- costs the same at the 100,000th conversation as at the first.
--
-- The WHERE of a listing on conversation c takes parameters $4..$13
-- (internal/store's filterArgs). The live index serves the live tests,
-- the awaiting index the await's; "failed" (a turn, a root task, failed:
-- not a tool inside a turn that answered) and "kind" read the
-- conversation's tasks until one matches.
--
-- A listed conversation is conversation c's columns, its newest task
-- joined as "last" (one probe of the conversation's end of its index).


-- LiveConversations lists the conversations that have live tasks, in id
-- order, at most limit of them (0: no limit). With statuses given, only the
-- conversations with a live task in one of them are listed (their counts
-- still cover every live status), with how many of the sleeping tasks are
-- parked in an await.
--
-- Locks: none (a read).
-- name: LiveConversations
WITH live AS (
    SELECT conversation_id, status, count(*) AS n, count(*) FILTER (WHERE status = 'sleeping' AND await_name IS NOT NULL) AS awaiting
    FROM {schema}.tasks
    WHERE status IN ({live})
    GROUP BY conversation_id, status),
picked AS (
    SELECT DISTINCT conversation_id FROM live
    WHERE cardinality($1::text[]) = 0 OR status = ANY($1::text[])
    ORDER BY conversation_id LIMIT $2)
SELECT c.id, coalesce(c.holder, ''), c.epoch,
    (SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.tenant, l.status, l.n, l.awaiting
FROM picked p
JOIN {schema}.conversations c ON c.id = p.conversation_id
JOIN live l ON l.conversation_id = p.conversation_id
ORDER BY c.id, l.status;

-- RecentConversations lists up to limit conversations that had a task
-- created lately, the most recent first: those of the newest 1,000 tasks,
-- live or settled. It reads those tasks backwards along the primary key, so
-- that it costs the same on a table of a billion tasks as on one of a
-- thousand.
--
-- Locks: none (a read).
-- name: RecentConversations
WITH recent AS (
    SELECT conversation_id, max(id) AS last
    FROM (SELECT conversation_id, id FROM {schema}.tasks ORDER BY id DESC LIMIT 1000) t
    GROUP BY conversation_id
    ORDER BY last DESC LIMIT $1)
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant
FROM recent r JOIN {schema}.conversations c ON c.id = r.conversation_id
ORDER BY r.last DESC;

-- By id: the next $3 conversations after $1 along the primary key, those of
-- them the filter keeps (at most $2). The scan's count and its last id come
-- with every row, and with one row of nulls when none is kept.
--
-- ConversationsByID lists up to limit conversations the filter keeps among
-- the next scan after id after (""), in id order.
--
-- Locks: none (a read).
-- name: ConversationsByID
WITH scan AS (
    SELECT c.id FROM {schema}.conversations c
    WHERE c.id > $1 AND ($4 = '' OR c.id >= $4)
    ORDER BY c.id LIMIT $3),
bounds AS (SELECT count(*) AS n, max(s.id) AS last FROM scan s),
picked AS (
    SELECT c.id FROM scan s JOIN {schema}.conversations c ON c.id = s.id
    WHERE ($4 = '' OR starts_with(c.id, $4))
    AND ($5 = '' OR c.holder = $5)
    AND ($6 = 0 OR ($6 = 1) = EXISTS (SELECT 1 FROM {schema}.tasks lt WHERE lt.conversation_id = c.id AND lt.status IN ({live})))
    AND (cardinality($7::text[]) = 0 OR EXISTS (SELECT 1 FROM {schema}.tasks st
    WHERE st.conversation_id = c.id AND st.status IN ({live}) AND st.status = ANY($7::text[])))
    AND (NOT $8 OR EXISTS (SELECT 1 FROM {schema}.tasks ft WHERE ft.conversation_id = c.id AND ft.status = 'failed' AND ft.owner_task_id IS NULL))
    AND (NOT $9 OR EXISTS (SELECT 1 FROM {schema}.tasks wt
    WHERE wt.conversation_id = c.id AND wt.status = 'sleeping' AND wt.await_name IS NOT NULL))
    AND ($10 = '' OR EXISTS (SELECT 1 FROM {schema}.tasks kt WHERE kt.conversation_id = c.id AND kt.kind = $10))
    AND ($11::timestamptz IS NULL OR c.created_at >= $11)
    AND ($12::timestamptz IS NULL OR c.created_at < $12)
    AND ($13::text IS NULL OR c.tenant = $13)
    ORDER BY c.id LIMIT $2)
SELECT b.n, coalesce(b.last, ''), 0::bigint, r.* FROM bounds b LEFT JOIN LATERAL (
    SELECT c.id, coalesce(c.holder, ''), c.epoch,
    (SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant,
    (SELECT jsonb_object_agg(x.status, x.n) FROM (SELECT lt.status, count(*) AS n FROM {schema}.tasks lt
    WHERE lt.conversation_id = c.id AND lt.status IN ({live}) GROUP BY lt.status) x),
    EXISTS (SELECT 1 FROM {schema}.tasks ft WHERE ft.conversation_id = c.id AND ft.status = 'failed' AND ft.owner_task_id IS NULL),
    (SELECT count(*) FROM {schema}.tasks wt WHERE wt.conversation_id = c.id AND wt.status = 'sleeping' AND wt.await_name IS NOT NULL),
    coalesce(last.id, 0), coalesce(last.kind, ''), coalesce(last.status, ''), last.created_at, 0::bigint AS key
    FROM picked p JOIN {schema}.conversations c ON c.id = p.id
    LEFT JOIN LATERAL (SELECT lt.id, lt.kind, lt.status, lt.created_at FROM {schema}.tasks lt
        WHERE lt.conversation_id = c.id ORDER BY lt.id DESC LIMIT 1) last ON true) r ON true
ORDER BY r.id;

-- By recency: the newest $3 tasks below task id $1, along the primary key
-- backwards; their conversations whose newest task is among them (the others
-- were on an earlier page), newest first, those the filter keeps (at most
-- $2). The scan's count and its lowest task id come with every row.
--
-- ConversationsByRecent lists up to limit conversations the filter keeps
-- among those of the next scan tasks below task id before, the newest first.
--
-- Locks: none (a read).
-- name: ConversationsByRecent
WITH win AS (
    SELECT t.conversation_id, t.id FROM {schema}.tasks t
    WHERE t.id < $1 ORDER BY t.id DESC LIMIT $3),
bounds AS (SELECT count(*) AS n, min(w.id) AS low FROM win w),
latest AS (SELECT w.conversation_id AS id, max(w.id) AS last FROM win w GROUP BY w.conversation_id),
picked AS (
    SELECT c.id, l.last FROM latest l JOIN {schema}.conversations c ON c.id = l.id
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks nt WHERE nt.conversation_id = c.id AND nt.id >= $1)
      AND ($4 = '' OR starts_with(c.id, $4))
    AND ($5 = '' OR c.holder = $5)
    AND ($6 = 0 OR ($6 = 1) = EXISTS (SELECT 1 FROM {schema}.tasks lt WHERE lt.conversation_id = c.id AND lt.status IN ({live})))
    AND (cardinality($7::text[]) = 0 OR EXISTS (SELECT 1 FROM {schema}.tasks st
    WHERE st.conversation_id = c.id AND st.status IN ({live}) AND st.status = ANY($7::text[])))
    AND (NOT $8 OR EXISTS (SELECT 1 FROM {schema}.tasks ft WHERE ft.conversation_id = c.id AND ft.status = 'failed' AND ft.owner_task_id IS NULL))
    AND (NOT $9 OR EXISTS (SELECT 1 FROM {schema}.tasks wt
    WHERE wt.conversation_id = c.id AND wt.status = 'sleeping' AND wt.await_name IS NOT NULL))
    AND ($10 = '' OR EXISTS (SELECT 1 FROM {schema}.tasks kt WHERE kt.conversation_id = c.id AND kt.kind = $10))
    AND ($11::timestamptz IS NULL OR c.created_at >= $11)
    AND ($12::timestamptz IS NULL OR c.created_at < $12)
    AND ($13::text IS NULL OR c.tenant = $13)
    ORDER BY l.last DESC LIMIT $2)
SELECT b.n, '', coalesce(b.low, 0), r.* FROM bounds b LEFT JOIN LATERAL (
    SELECT c.id, coalesce(c.holder, ''), c.epoch,
    (SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant,
    (SELECT jsonb_object_agg(x.status, x.n) FROM (SELECT lt.status, count(*) AS n FROM {schema}.tasks lt
    WHERE lt.conversation_id = c.id AND lt.status IN ({live}) GROUP BY lt.status) x),
    EXISTS (SELECT 1 FROM {schema}.tasks ft WHERE ft.conversation_id = c.id AND ft.status = 'failed' AND ft.owner_task_id IS NULL),
    (SELECT count(*) FROM {schema}.tasks wt WHERE wt.conversation_id = c.id AND wt.status = 'sleeping' AND wt.await_name IS NOT NULL),
    coalesce(last.id, 0), coalesce(last.kind, ''), coalesce(last.status, ''), last.created_at, p.last AS key
    FROM picked p JOIN {schema}.conversations c ON c.id = p.id
    LEFT JOIN {schema}.tasks last ON last.conversation_id = c.id AND last.id = p.last) r ON true
ORDER BY r.key DESC;

-- LiveCounts counts the live tasks by status, and the tasks awaiting an
-- event, reading at most limit rows of each.
--
-- Locks: none (a read).
-- name: LiveCounts
SELECT t.status, count(*) FROM (
    SELECT status FROM {schema}.tasks WHERE status IN ({live}) LIMIT $1) t GROUP BY t.status
UNION ALL
SELECT 'awaiting', count(*) FROM (
    SELECT 1 FROM {schema}.tasks WHERE status = 'sleeping' AND await_name IS NOT NULL LIMIT $1) a;

-- The budgets a task's spend counts against: its own, its owners' up to the
-- turn, the conversation's (the scope chain, as a reservation walks it: a
-- walk up, see tree.go).
--
-- TaskBudgets reads the budgets taskID's spend counts against (its own, its
-- owners', its conversation's) and what it spent and holds itself.
--
-- Locks: none (a read).
-- name: TaskBudgets
WITH RECURSIVE chain (id, owner_task_id) AS (
    SELECT id, owner_task_id FROM {schema}.tasks WHERE conversation_id = $1 AND id = $2
    UNION ALL
    SELECT o.id, o.owner_task_id FROM chain ch CROSS JOIN LATERAL (
        SELECT o.id, o.owner_task_id FROM {schema}.tasks o
        WHERE o.conversation_id = $1 AND o.id = ch.owner_task_id OFFSET 0) o)
SELECT b.conversation_id, coalesce(b.task_id, 0), b.counter,
    coalesce(b.max, 9223372036854775807),
    CASE WHEN b.counter = 'wall_ms'
        THEN (extract(epoch FROM now() - coalesce(t.created_at, c.created_at)) * 1000)::bigint
        ELSE b.spent END,
    b.reserved, b.carried, b.on_exhausted, b.updated_at
FROM {schema}.budgets b
JOIN {schema}.conversations c ON c.id = b.conversation_id
LEFT JOIN {schema}.tasks t ON t.conversation_id = b.conversation_id AND t.id = b.task_id
WHERE b.conversation_id = $1 AND (b.task_id IS NULL OR b.task_id IN (SELECT id FROM chain))
ORDER BY coalesce(b.task_id, 0), b.counter;

-- Store.TaskBudgets reads the budgets taskID's spend counts against (its
-- own, its owners', its conversation's) and what it spent and holds itself.
--
-- Locks: none (a read).
-- name: TaskSpend
SELECT task_id, counter, coalesce(sum(actual), 0), coalesce(sum(amount) FILTER (WHERE actual IS NULL), 0)
FROM {schema}.budget_reservations WHERE conversation_id = $1 AND task_id = $2
GROUP BY task_id, counter ORDER BY counter;

-- Holders reads up to limit holder rows, by name then newest first, each
-- with the conversations it holds counted up to held.
--
-- Locks: none (a read).
-- name: Holders
SELECT h.id, h.name, h.expires_at, h.renewed_at, h.created_at, now(),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = h.id LIMIT $2) x)
FROM {schema}.holders h ORDER BY h.name, h.id DESC LIMIT $1;

-- RecentRestarts reads up to limit tasks with attempt > 0 among the scan
-- newest tasks, the newest first.
--
-- Locks: none (a read).
-- name: RecentRestarts
SELECT {summary_columns}, coalesce(cardinality(wait_ids), 0) FROM (
    SELECT * FROM {schema}.tasks ORDER BY id DESC LIMIT $1) t
WHERE t.attempt > 0 ORDER BY t.id DESC LIMIT $2;
