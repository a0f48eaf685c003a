-- Forgeries a role with DML on arbor's tables could still commit (issue
-- 38, "defence in depth"), refused here.
--
-- The record guards, generated from fsm.RecordRules (migrations/records/):
-- a fork's copy of an event (G3) was any event that named a forked task:
-- in a forked conversation, one backdated to 2000, already delivered to
-- the fork's own live turn, with an approval no one gave, went in and,
-- with the wake, approved that turn. A copy is now made only in the
-- fork's own transaction (its conversation stamped now), names forked
-- tasks only, and is an event of their sources, field for field.
-- arbor:records 033

-- G5. The prune's mark (migration 019) names the transaction that inserts
-- it, and nothing else: a role granted INSERT on prune_marks (the runtime
-- role) could insert marks for transaction ids not yet given out
-- (pg_current_xact_id() + 1 … + 300), and a later transaction of a role
-- without that grant was then "marked" and deleted history. A mark is
-- inserted as its transaction's own id (store.MarkPrune inserts the
-- default) and never changed; any other id, or an update, is refused
-- (AB009, fsm.SQLStateRecord). A row of prune_marks that committed is a
-- leftover (a prune removes its mark before it commits) or such a
-- forgery: they are removed here. A prune under way holds its mark
-- uncommitted, which this delete does not see.
CREATE FUNCTION {schema}.prune_mark_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'arbor: a prune mark is never changed (transaction %)', OLD.txid
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.txid IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'arbor: a prune mark names the transaction that inserts it (%), not %', pg_current_xact_id(), NEW.txid
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

CREATE TRIGGER prune_mark_guard BEFORE INSERT OR UPDATE ON {schema}.prune_marks
    FOR EACH ROW EXECUTE FUNCTION {schema}.prune_mark_guard();

DELETE FROM {schema}.prune_marks;

-- G1. A budget's sums agree with its scope's reservations at commit
-- (migration 021), but the check ran only for a transaction that changed
-- a budget row: a reservation closed at 0, or inserted open with its run's
-- token, with the budgets left as they were, committed. A transaction that
-- inserts a reservation or changes what it spent (actual) now checks, at
-- its commit, every budget of the reservation's counter over its task: the
-- task's own, its owners' up to the root, the conversation's; as 021 does
-- for a budget, with the same sums (wall-time budgets keep none). When
-- arbor's own statements change both (every reserve, record, spend and
-- lapse does), a budget is checked by both triggers: twice the sums.
CREATE FUNCTION {schema}.reservation_sums_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    b {schema}.budgets%ROWTYPE;
    closed bigint;
    open bigint;
BEGIN
    FOR b IN
        WITH RECURSIVE up (id, owner_task_id) AS (
            SELECT t.id, t.owner_task_id FROM {schema}.tasks t
            WHERE t.conversation_id = NEW.conversation_id AND t.id = NEW.task_id
            UNION ALL
            SELECT o.id, o.owner_task_id FROM up CROSS JOIN LATERAL (SELECT o.id, o.owner_task_id FROM {schema}.tasks o
                WHERE o.conversation_id = NEW.conversation_id AND o.id = up.owner_task_id OFFSET 0) o)
        SELECT g.* FROM (SELECT up.id FROM up UNION ALL SELECT 0) s
        CROSS JOIN LATERAL (SELECT g.* FROM {schema}.budgets g
            WHERE g.conversation_id = NEW.conversation_id AND g.counter = NEW.counter
              AND coalesce(g.task_id, 0) = s.id OFFSET 0) g
    LOOP
        IF b.task_id IS NULL THEN
            SELECT coalesce(sum(r.actual), 0), coalesce(sum(r.amount) FILTER (WHERE r.actual IS NULL), 0) INTO closed, open
            FROM {schema}.budget_reservations r WHERE r.conversation_id = b.conversation_id AND r.counter = b.counter;
        ELSE
            WITH RECURSIVE sub (id) AS (
                SELECT t.id FROM {schema}.tasks t WHERE t.conversation_id = b.conversation_id AND t.id = b.task_id
                UNION ALL
                SELECT d.id FROM sub s CROSS JOIN LATERAL (SELECT t.id FROM {schema}.tasks t
                    WHERE t.conversation_id = b.conversation_id AND t.owner_task_id = s.id OFFSET 0) d)
            SELECT coalesce(sum(r.actual), 0), coalesce(sum(r.amount) FILTER (WHERE r.actual IS NULL), 0) INTO closed, open
            FROM sub CROSS JOIN LATERAL (SELECT r.actual, r.amount FROM {schema}.budget_reservations r
                WHERE r.conversation_id = b.conversation_id AND r.task_id = sub.id AND r.counter = b.counter OFFSET 0) r;
        END IF;
        IF b.spent <> closed + b.carried OR b.reserved <> open THEN
            RAISE EXCEPTION 'arbor: reservation % (task %): budget % of % (task %) has spent % and reserved %, but its scope''s reservations explain spent % and reserved %',
                NEW.id, NEW.task_id, b.counter, b.conversation_id, coalesce(b.task_id, 0), b.spent, b.reserved, closed + b.carried, open
                USING ERRCODE = 'AB009';
        END IF;
    END LOOP;
    RETURN NULL;
END
$guard$;

CREATE CONSTRAINT TRIGGER reservation_sums_guard AFTER INSERT ON {schema}.budget_reservations
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.counter <> 'wall_ms')
    EXECUTE FUNCTION {schema}.reservation_sums_guard();
CREATE CONSTRAINT TRIGGER reservation_sums_guard_update AFTER UPDATE OF actual ON {schema}.budget_reservations
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.counter <> 'wall_ms' AND NEW.actual IS DISTINCT FROM OLD.actual)
    EXECUTE FUNCTION {schema}.reservation_sums_guard();

-- G2. The log's INSERT check (migration 028) took entries arbor never
-- writes, as guarantees.md says it refuses: an event entry stamped before
-- its conversation existed (028 let such entries through as a fork's
-- copies), a second `completed` entry for a task settled long ago (its
-- status was still `completed`), `failed` and progress entries for a
-- fork's copies (any entry of a copy went in), a status entry with no
-- task and no status. Now, besides 028's rules:
--
--   - a status entry names a task and a status, and is written by the
--     statement that wrote its task: the task's row and the entry were
--     written by the same transaction (or subtransaction: every statement
--     of arbor's that changes a status logs it in the same statement, so
--     both rows carry the same xmin; a settled task never changes again,
--     so its settle is logged once);
--   - a fork's copies go in only in the fork's own (sub)transaction: an
--     entry of a copied task only where that copy was inserted (the same
--     xmin), an entry of the conversation's own only where the
--     conversation was made (stamped now) and its copies inserted;
--   - no other entry is stamped before its conversation or its task was
--     created.
--
-- As in 028, one statement per INSERT statement over its new rows, each
-- looked up by key (the entry's own row by seq, for its xmin; its task
-- and conversation by primary key), linear in the rows inserted.
CREATE OR REPLACE FUNCTION {schema}.log_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    bad_seq bigint;
    bad_kind text;
BEGIN
    SELECT a.seq, a.kind INTO bad_seq, bad_kind
    FROM added a
    CROSS JOIN LATERAL (SELECT l.xmin FROM {schema}.conversation_log l WHERE l.seq = a.seq OFFSET 0) l
    LEFT JOIN LATERAL (SELECT c.created_at FROM {schema}.conversations c
        WHERE (a.task_id IS NULL OR a.kind = 'event') AND c.id = a.conversation_id OFFSET 0) c ON true
    LEFT JOIN LATERAL (SELECT t.status, t.forked_from, t.created_at, t.xmin FROM {schema}.tasks t
        WHERE t.id = a.task_id AND t.conversation_id = a.conversation_id OFFSET 0) t ON true
    CROSS JOIN LATERAL (SELECT CASE
        WHEN a.task_id IS NOT NULL THEN t.forked_from IS NOT NULL AND t.xmin = l.xmin
        WHEN c.created_at = now() THEN (SELECT f.xmin FROM {schema}.tasks f
            WHERE f.conversation_id = a.conversation_id AND f.forked_from IS NOT NULL LIMIT 1) = l.xmin
        ELSE false END AS copy) k
    WHERE (c.created_at IS NULL AND (a.task_id IS NULL OR a.kind = 'event'))
       OR a.at > clock_timestamp()
       OR (a.task_id IS NOT NULL AND t.status IS NULL)
       OR (a.kind IN ('status', 'progress') AND a.task_id IS NULL)
       OR (a.kind = 'status' AND a.status IS NULL)
       OR (NOT coalesce(k.copy, false) AND (
              (a.kind = 'status' AND (t.forked_from IS NOT NULL OR a.status IS DISTINCT FROM t.status OR t.xmin <> l.xmin))
           OR (a.kind = 'progress' AND (t.forked_from IS NOT NULL OR t.status <> 'running'))
           OR a.at < c.created_at
           OR a.at < t.created_at
           OR (a.kind = 'event' AND NOT coalesce(
                jsonb_typeof(a.payload) = 'object' AND a.payload->>'event_id' ~ '^[0-9]{1,18}$'
                AND EXISTS (SELECT 1 FROM {schema}.events ev
                    WHERE ev.id = (a.payload->>'event_id')::bigint AND ev.conversation_id = a.conversation_id
                      AND ev.name IS NOT DISTINCT FROM a.name
                      AND (a.task_id IS NULL OR ev.task_id IS NOT DISTINCT FROM a.task_id)), false))))
    LIMIT 1;
    IF bad_seq IS NOT NULL THEN
        RAISE EXCEPTION 'arbor: log entry % (%) is not one arbor writes: the log records what the tasks and events are, appended by the statements that change them', bad_seq, bad_kind
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;
