-- Tenants on one database (issue 40; docs/design.md §3.15): a tenant key on
-- every conversation and its tasks, a weight per tenant for the fair claim,
-- a priority per task with aging, concurrency limits per key, and a time to
-- live for a queued turn.

-- A conversation belongs to one tenant, set when it is created and never
-- changed ('' is the default tenant). The unique index is what the tasks'
-- key below references.
ALTER TABLE {schema}.conversations
    ADD COLUMN tenant text NOT NULL DEFAULT '' CHECK (octet_length(tenant) <= 200);
CREATE UNIQUE INDEX conversations_tenant_idx ON {schema}.conversations (id, tenant);

-- A task carries its conversation's tenant (the foreign key makes it a
-- fact), so that the claim finds each tenant's oldest work by an index; its
-- priority; the time it queues at (created_at less one second per level of
-- priority: the aging); a queued turn's time to live; the key it names for a
-- concurrency limit; and, while it runs, the limits whose slots it holds.
ALTER TABLE {schema}.tasks
    ADD COLUMN tenant           text        NOT NULL DEFAULT '',
    ADD COLUMN priority         integer     NOT NULL DEFAULT 0 CHECK (priority BETWEEN -3600 AND 3600),
    ADD COLUMN queue_at         timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN queue_expires_at timestamptz,
    ADD COLUMN concurrency_key  text        CHECK (concurrency_key <> '' AND octet_length(concurrency_key) <= 200),
    ADD COLUMN slots            text[];
ALTER TABLE {schema}.tasks
    ADD CONSTRAINT tasks_tenant_fkey FOREIGN KEY (conversation_id, tenant) REFERENCES {schema}.conversations (id, tenant);
ALTER TABLE {schema}.tasks DROP CONSTRAINT tasks_conversation_id_fkey;

-- The fair claim's index: each tenant's pending tasks in queue order.
CREATE INDEX tasks_pending_tenant_idx ON {schema}.tasks (tenant, queue_at) WHERE status = 'pending';

-- The queued tasks whose time to live passes, for the sweep that cancels
-- them (only the tasks created with one are in it).
CREATE INDEX tasks_queue_expiry_idx ON {schema}.tasks (queue_expires_at)
    WHERE status = 'pending' AND queue_expires_at IS NOT NULL;

-- A tenant's weight in the fair claim (docs/design.md §3.15): a tenant
-- with no row weighs 1.
CREATE TABLE {schema}.tenants (
    tenant     text        PRIMARY KEY CHECK (octet_length(tenant) <= 200),
    weight     integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A concurrency limit: at most max tasks running at once, across every
-- node, whose key is this one: "tenant:<tenant>", "kind:<kind>" or
-- "key:<the task's concurrency key>". running counts the runs holding a
-- slot of it (tasks.slots names it); it changes only in task_slots().
CREATE TABLE {schema}.concurrency_limits (
    key        text        PRIMARY KEY CHECK (key ~ '^(tenant|kind|key):' AND octet_length(key) <= 210),
    max        integer     NOT NULL CHECK (max >= 0),
    running    integer     NOT NULL DEFAULT 0 CHECK (running >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The slots of a start and of a run's end. A start (pending → running)
-- locks the limits of the task's keys, in key order, and reads them as
-- committed last (FOR UPDATE); if one is full, the row is skipped (the
-- trigger returns NULL: the task stays pending, and the claim that tried
-- it starts the others); else each limit's running count grows by one and
-- the task names them in slots. A run's end (running → anything) gives
-- them back. Every start and every end of a run goes through here, in the
-- transaction that makes it (a recovery at take-over included), so a slot
-- is held exactly while its run is running: none is leaked by a node that
-- died, and none is given twice (the lock orders the starts of a key, and
-- each reads the count the one before it committed).
--
-- A start also refuses a turn queued past its time to live
-- (queue_expires_at, before its first start): every claim filters those
-- out with the same now(), so only a forged start meets this.
CREATE FUNCTION {schema}.task_slots() RETURNS trigger
LANGUAGE plpgsql AS $slots$
DECLARE
    keys   text[];
    isfull boolean;
BEGIN
    IF OLD.status = 'running' THEN
        UPDATE {schema}.concurrency_limits SET running = running - 1, updated_at = now()
        WHERE key = ANY(OLD.slots) AND running > 0;
        NEW.slots := NULL;
        RETURN NEW;
    END IF;
    IF NEW.queue_expires_at IS NOT NULL AND OLD.started_at IS NULL AND NEW.queue_expires_at <= now() THEN
        RAISE EXCEPTION 'arbor: task % expired in its queue at %: it never starts', OLD.id, NEW.queue_expires_at
            USING ERRCODE = 'AB005';
    END IF;
    SELECT array_agg(l.key ORDER BY l.key), coalesce(bool_or(l.running >= l.max), false) INTO keys, isfull
    FROM (SELECT c.key, c.running, c.max FROM {schema}.concurrency_limits c
          WHERE c.key IN ('tenant:' || NEW.tenant, 'kind:' || NEW.kind, 'key:' || NEW.concurrency_key)
          ORDER BY c.key FOR UPDATE) l;
    IF keys IS NULL THEN
        NEW.slots := NULL;
        RETURN NEW;
    END IF;
    IF isfull THEN
        RETURN NULL;
    END IF;
    UPDATE {schema}.concurrency_limits SET running = running + 1, updated_at = now() WHERE key = ANY(keys);
    NEW.slots := keys;
    RETURN NEW;
END
$slots$;

-- Named to fire before any other BEFORE UPDATE trigger of a user's, and
-- called only for a start or the end of a run that holds slots (the WHEN
-- clause is evaluated without calling the function).
CREATE TRIGGER "Arbor_task_slots"
    BEFORE UPDATE OF status ON {schema}.tasks
    FOR EACH ROW
    WHEN ((OLD.status = 'pending' AND NEW.status = 'running')
        OR (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.slots IS NOT NULL))
    EXECUTE FUNCTION {schema}.task_slots();

-- A conversation's tenant never changes.
CREATE FUNCTION {schema}.conversation_tenant_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: conversation %: its tenant never changes (% -> %)', OLD.id, OLD.tenant, NEW.tenant
        USING ERRCODE = 'AB007';
END
$guard$;
CREATE TRIGGER "Arbor_conversation_tenant_guard"
    BEFORE UPDATE OF tenant ON {schema}.conversations
    FOR EACH ROW WHEN (NEW.tenant IS DISTINCT FROM OLD.tenant)
    EXECUTE FUNCTION {schema}.conversation_tenant_guard();

-- BEGIN arbor:guard (written by go generate ./fsm from package fsm; do not edit)
-- Code generated by go generate ./fsm; DO NOT EDIT.
-- The database's copy of arbor's rules for task rows (fsm/fsm.go and
-- internal/guardrules/columns.go; docs/design.md §2 and docs/state-machine.md): which status
-- changes exist, which columns may change with each, what a fresh row looks
-- like; and the conversations' guard.

CREATE OR REPLACE FUNCTION {schema}.task_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    change text;
    src {schema}.tasks%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT ({schema}.prune_marked()) THEN
            RAISE EXCEPTION 'arbor: task % cannot be deleted: only the prune path deletes (tasks.Engine.Prune, the runners'' prune job)', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        IF NOT (OLD.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) THEN
            RAISE EXCEPTION 'arbor: task % cannot be deleted: a live task is never deleted', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        IF NOT (NOT EXISTS (WITH RECURSIVE up AS (
                SELECT o.id, o.owner_task_id, o.status FROM {schema}.tasks o WHERE o.id = OLD.owner_task_id
                UNION ALL
                SELECT o.id, o.owner_task_id, o.status FROM {schema}.tasks o JOIN up ON o.id = up.owner_task_id)
            SELECT 1 FROM up WHERE up.status NOT IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned'))) THEN
            RAISE EXCEPTION 'arbor: task % cannot be deleted: nothing live above it still reads it', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        IF NOT (OLD.owner_task_id IS NOT NULL
            OR (SELECT l.id FROM {schema}.tasks l WHERE l.conversation_id = OLD.conversation_id AND l.status IN ('pending', 'running', 'waiting', 'sleeping', 'completing') ORDER BY l.conversation_id, l.status LIMIT 1) IS NULL
            OR (SELECT n.id FROM {schema}.tasks n WHERE n.conversation_id = OLD.conversation_id AND n.owner_task_id IS NULL
                AND n.id > OLD.id AND n.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned') ORDER BY n.conversation_id, n.owner_task_id LIMIT 1) IS NOT NULL) THEN
            RAISE EXCEPTION 'arbor: task % cannot be deleted: a conversation in use keeps its newest settled turn', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.forked_from IS NOT NULL THEN
        SELECT * INTO src FROM {schema}.tasks WHERE id = NEW.forked_from;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'arbor: task % is forked from task %, which does not exist', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.kind IS NOT DISTINCT FROM src.kind) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.kind IS NOT DISTINCT FROM src.kind does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.status IS NOT DISTINCT FROM src.status) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.status IS NOT DISTINCT FROM src.status does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.background IS NOT DISTINCT FROM src.background) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.background IS NOT DISTINCT FROM src.background does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.input IS NOT DISTINCT FROM src.input) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.input IS NOT DISTINCT FROM src.input does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.phase IS NOT DISTINCT FROM src.phase) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.phase IS NOT DISTINCT FROM src.phase does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.state IS NOT DISTINCT FROM src.state) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.state IS NOT DISTINCT FROM src.state does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.result IS NOT DISTINCT FROM src.result) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.result IS NOT DISTINCT FROM src.result does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.error IS NOT DISTINCT FROM src.error) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.error IS NOT DISTINCT FROM src.error does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.attempt IS NOT DISTINCT FROM src.attempt) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.attempt IS NOT DISTINCT FROM src.attempt does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.restart_limit IS NOT DISTINCT FROM src.restart_limit) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.restart_limit IS NOT DISTINCT FROM src.restart_limit does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.abandon_on_restart IS NOT DISTINCT FROM src.abandon_on_restart) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.abandon_on_restart IS NOT DISTINCT FROM src.abandon_on_restart does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.abort_requested IS NOT DISTINCT FROM src.abort_requested) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.abort_requested IS NOT DISTINCT FROM src.abort_requested does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.wait_policy IS NOT DISTINCT FROM src.wait_policy) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.wait_policy IS NOT DISTINCT FROM src.wait_policy does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.wake_at IS NOT DISTINCT FROM src.wake_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.wake_at IS NOT DISTINCT FROM src.wake_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.sleep_seq IS NOT DISTINCT FROM src.sleep_seq) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.sleep_seq IS NOT DISTINCT FROM src.sleep_seq does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.max_retries IS NOT DISTINCT FROM src.max_retries) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.max_retries IS NOT DISTINCT FROM src.max_retries does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.retries IS NOT DISTINCT FROM src.retries) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.retries IS NOT DISTINCT FROM src.retries does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.retry_backoff_base IS NOT DISTINCT FROM src.retry_backoff_base) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.retry_backoff_base IS NOT DISTINCT FROM src.retry_backoff_base does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.retry_backoff_cap IS NOT DISTINCT FROM src.retry_backoff_cap) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.retry_backoff_cap IS NOT DISTINCT FROM src.retry_backoff_cap does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.error_history IS NOT DISTINCT FROM src.error_history) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.error_history IS NOT DISTINCT FROM src.error_history does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.idempotency_key IS NOT DISTINCT FROM src.idempotency_key) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.idempotency_key IS NOT DISTINCT FROM src.idempotency_key does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.created_at IS NOT DISTINCT FROM src.created_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.created_at IS NOT DISTINCT FROM src.created_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.started_at IS NOT DISTINCT FROM src.started_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.started_at IS NOT DISTINCT FROM src.started_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.settled_at IS NOT DISTINCT FROM src.settled_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.settled_at IS NOT DISTINCT FROM src.settled_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.await_name IS NOT DISTINCT FROM src.await_name) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.await_name IS NOT DISTINCT FROM src.await_name does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.deadline IS NOT DISTINCT FROM src.deadline) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.deadline IS NOT DISTINCT FROM src.deadline does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.trace IS NOT DISTINCT FROM src.trace) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.trace IS NOT DISTINCT FROM src.trace does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.tenant IS NOT DISTINCT FROM src.tenant) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.tenant IS NOT DISTINCT FROM src.tenant does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.priority IS NOT DISTINCT FROM src.priority) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.priority IS NOT DISTINCT FROM src.priority does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.queue_at IS NOT DISTINCT FROM src.queue_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.queue_at IS NOT DISTINCT FROM src.queue_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.queue_expires_at IS NOT DISTINCT FROM src.queue_expires_at) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.queue_expires_at IS NOT DISTINCT FROM src.queue_expires_at does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.concurrency_key IS NOT DISTINCT FROM src.concurrency_key) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.concurrency_key IS NOT DISTINCT FROM src.concurrency_key does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (src.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: src.status IN (''completed'', ''failed'', ''aborted'', ''cancelled'', ''orphaned'') does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.conversation_id <> src.conversation_id) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.conversation_id <> src.conversation_id does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((SELECT l.id FROM {schema}.tasks l WHERE l.conversation_id = NEW.conversation_id AND l.status IN ('pending', 'running', 'waiting', 'sleeping', 'completing') ORDER BY l.conversation_id, l.status LIMIT 1) IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (SELECT l.id FROM {schema}.tasks l WHERE l.conversation_id = NEW.conversation_id AND l.status IN (''pending'', ''running'', ''waiting'', ''sleeping'', ''completing'') ORDER BY l.conversation_id, l.status LIMIT 1) IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((NEW.owner_task_id IS NULL) = (src.owner_task_id IS NULL)) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (NEW.owner_task_id IS NULL) = (src.owner_task_id IS NULL) does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((NEW.owner_task_id IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id AND o.forked_from = src.owner_task_id))) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (NEW.owner_task_id IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id AND o.forked_from = src.owner_task_id)) does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.token IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.token IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.run_epoch IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.run_epoch IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.lease_expires_at IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.lease_expires_at IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.wake_job_id IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.wake_job_id IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.await_token IS NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.await_token IS NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.settle_seq IS NOT NULL) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.settle_seq IS NOT NULL does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (NEW.settle_seq > 0) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: NEW.settle_seq > 0 does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((NEW.wait_ids IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id) WHERE w.id <= NEW.id))) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (NEW.wait_ids IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id) WHERE w.id <= NEW.id)) does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((NEW.wait_ids IS NULL) = (src.wait_ids IS NULL)) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (NEW.wait_ids IS NULL) = (src.wait_ids IS NULL) does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT (coalesce(cardinality(NEW.wait_ids), 0) <= coalesce(cardinality(src.wait_ids), 0)) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: coalesce(cardinality(NEW.wait_ids), 0) <= coalesce(cardinality(src.wait_ids), 0) does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        IF NOT ((NEW.delivered - 'event_id') IS NOT DISTINCT FROM (src.delivered - 'event_id')) THEN
            RAISE EXCEPTION 'arbor: task % is not a faithful fork of task %: (NEW.delivered - ''event_id'') IS NOT DISTINCT FROM (src.delivered - ''event_id'') does not hold', NEW.id, NEW.forked_from
                USING ERRCODE = 'AB008';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT (NEW.status = 'pending'
            AND NEW.token IS NULL
            AND NEW.run_epoch IS NULL
            AND NEW.lease_expires_at IS NULL
            AND NEW.started_at IS NULL
            AND NEW.settled_at IS NULL
            AND NEW.settle_seq IS NULL
            AND NEW.attempt = 0
            AND NEW.retries = 0
            AND NEW.sleep_seq = 0
            AND NOT NEW.abort_requested
            AND NEW.phase = ''
            AND NEW.state IS NULL
            AND NEW.result IS NULL
            AND NEW.error IS NULL
            AND NEW.error_history = '[]'::jsonb
            AND NEW.wait_policy IS NULL
            AND NEW.wait_ids IS NULL
            AND NEW.wake_at IS NULL
            AND NEW.wake_job_id IS NULL
            AND NEW.await_name IS NULL
            AND NEW.await_token IS NULL
            AND NEW.delivered IS NULL
            AND NEW.slots IS NULL
            AND NEW.created_at = now()
            AND NEW.queue_at = NEW.created_at - NEW.priority * interval '1 second') THEN
            IF NOT (NEW.status = 'pending') THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.status = ''pending'' does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.token IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.token IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.run_epoch IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.run_epoch IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.lease_expires_at IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.lease_expires_at IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.started_at IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.started_at IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.settled_at IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.settled_at IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.settle_seq IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.settle_seq IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.attempt = 0) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.attempt = 0 does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.retries = 0) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.retries = 0 does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.sleep_seq = 0) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.sleep_seq = 0 does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NOT NEW.abort_requested) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NOT NEW.abort_requested does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.phase = '') THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.phase = '''' does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.state IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.state IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.result IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.result IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.error IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.error IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.error_history = '[]'::jsonb) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.error_history = ''[]''::jsonb does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.wait_policy IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.wait_policy IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.wait_ids IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.wait_ids IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.wake_at IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.wake_at IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.wake_job_id IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.wake_job_id IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.await_name IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.await_name IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.await_token IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.await_token IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.delivered IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.delivered IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.slots IS NULL) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.slots IS NULL does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.created_at = now()) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.created_at = now() does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
            IF NOT (NEW.queue_at = NEW.created_at - NEW.priority * interval '1 second') THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.queue_at = NEW.created_at - NEW.priority * interval ''1 second'' does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
        END IF;
        IF NEW.owner_task_id IS NOT NULL THEN
            IF NOT (EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id AND o.status IN ('pending', 'running', 'waiting', 'sleeping') AND NOT o.abort_requested)) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id AND o.status IN (''pending'', ''running'', ''waiting'', ''sleeping'') AND NOT o.abort_requested) does not hold'
                    USING ERRCODE = 'AB004';
            END IF;
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned') THEN
        RAISE EXCEPTION 'arbor: task % is settled (%) and never changes again', OLD.id, OLD.status
            USING ERRCODE = 'AB002';
    END IF;
    IF NEW.id <> OLD.id
        OR NEW.conversation_id <> OLD.conversation_id
        OR NEW.owner_task_id IS DISTINCT FROM OLD.owner_task_id
        OR NEW.kind <> OLD.kind
        OR NEW.background <> OLD.background THEN
        RAISE EXCEPTION 'arbor: task % identity (id, conversation, owner, kind, background) is immutable', OLD.id
            USING ERRCODE = 'AB003';
    END IF;
    change := OLD.status || '>' || NEW.status;
    IF NEW.status <> OLD.status AND change NOT IN ('pending>running', 'pending>failed', 'pending>aborted', 'pending>cancelled', 'pending>orphaned', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'waiting>pending', 'waiting>failed', 'waiting>aborted', 'waiting>cancelled', 'sleeping>pending', 'sleeping>failed', 'sleeping>aborted', 'sleeping>cancelled', 'completing>completed', 'completing>failed', 'completing>aborted') THEN
        RAISE EXCEPTION 'arbor: invalid transition of task %: % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'AB001';
    END IF;
    IF NEW.delivered IS DISTINCT FROM OLD.delivered THEN
        IF NOT (NEW.delivered IS NULL
            OR (coalesce(NEW.delivered->>'timed_out', '') = 'true' AND NOT (NEW.delivered ? 'event_id') AND NOT (NEW.delivered ? 'payload'))
            OR CASE WHEN NEW.delivered->>'event_id' ~ '^[0-9]{1,18}$' THEN EXISTS (SELECT 1 FROM {schema}.events ev
                WHERE ev.conversation_id = NEW.conversation_id AND ev.id = (NEW.delivered->>'event_id')::bigint
                  AND ev.delivered_to = NEW.id AND ev.payload IS NOT DISTINCT FROM NEW.delivered->'payload') ELSE false END) THEN
            RAISE EXCEPTION 'arbor: task %: column delivered may not change so on %', OLD.id, change
                USING ERRCODE = 'AB005', HINT = 'what woke an await (the event, or its timeout), cleared when the task parks again: an event delivered to this task, carried as it was emitted, or a timeout with no event';
        END IF;
    END IF;
    IF (NEW.input IS NOT DISTINCT FROM OLD.input OR false)
        AND (NEW.phase IS NOT DISTINCT FROM OLD.phase OR change IN ('running>running', 'running>waiting', 'running>sleeping'))
        AND (NEW.state IS NOT DISTINCT FROM OLD.state OR change IN ('running>running', 'running>waiting', 'running>sleeping'))
        AND (NEW.result IS NOT DISTINCT FROM OLD.result OR change IN ('running>completing', 'running>completed', 'pending>cancelled', 'running>cancelled', 'waiting>cancelled', 'sleeping>cancelled'))
        AND (NEW.error IS NOT DISTINCT FROM OLD.error OR change IN ('running>sleeping', 'pending>failed', 'running>failed', 'waiting>failed', 'sleeping>failed', 'completing>failed', 'pending>cancelled', 'running>cancelled', 'waiting>cancelled', 'sleeping>cancelled', 'pending>aborted', 'running>aborted', 'waiting>aborted', 'sleeping>aborted', 'completing>aborted', 'pending>orphaned'))
        AND (NEW.attempt IS NOT DISTINCT FROM OLD.attempt OR (change IN ('running>pending') AND (NEW.attempt = OLD.attempt + 1)))
        AND (NEW.restart_limit IS NOT DISTINCT FROM OLD.restart_limit OR false)
        AND (NEW.abandon_on_restart IS NOT DISTINCT FROM OLD.abandon_on_restart OR false)
        AND (NEW.abort_requested IS NOT DISTINCT FROM OLD.abort_requested OR (change IN ('pending>aborted', 'running>aborted', 'waiting>aborted', 'sleeping>aborted', 'completing>aborted', 'pending>orphaned') AND (NEW.abort_requested)))
        AND (NEW.wait_policy IS NOT DISTINCT FROM OLD.wait_policy OR change IN ('running>waiting'))
        AND (NEW.wait_ids IS NOT DISTINCT FROM OLD.wait_ids OR change IN ('running>waiting'))
        AND (NEW.wake_at IS NOT DISTINCT FROM OLD.wake_at OR (change IN ('running>sleeping', 'waiting>pending', 'sleeping>pending') AND (NEW.wake_at IS NOT NULL OR NEW.await_name IS NOT NULL OR NEW.status = 'pending')))
        AND (NEW.sleep_seq IS NOT DISTINCT FROM OLD.sleep_seq OR (change IN ('running>sleeping') AND (NEW.sleep_seq = OLD.sleep_seq + 1)))
        AND (NEW.max_retries IS NOT DISTINCT FROM OLD.max_retries OR false)
        AND (NEW.retries IS NOT DISTINCT FROM OLD.retries OR (change IN ('running>sleeping') AND (NEW.retries = OLD.retries + 1)))
        AND (NEW.retry_backoff_base IS NOT DISTINCT FROM OLD.retry_backoff_base OR false)
        AND (NEW.retry_backoff_cap IS NOT DISTINCT FROM OLD.retry_backoff_cap OR false)
        AND (NEW.error_history IS NOT DISTINCT FROM OLD.error_history OR change IN ('running>sleeping', 'pending>failed', 'running>failed', 'waiting>failed', 'sleeping>failed', 'completing>failed'))
        AND (NEW.wake_job_id IS NOT DISTINCT FROM OLD.wake_job_id OR change IN ('running>sleeping', 'waiting>pending', 'sleeping>pending'))
        AND (NEW.token IS NOT DISTINCT FROM OLD.token OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled'))
        AND (NEW.run_epoch IS NOT DISTINCT FROM OLD.run_epoch OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled'))
        AND (NEW.lease_expires_at IS NOT DISTINCT FROM OLD.lease_expires_at OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'running>running'))
        AND (NEW.idempotency_key IS NOT DISTINCT FROM OLD.idempotency_key OR false)
        AND (NEW.settle_seq IS NOT DISTINCT FROM OLD.settle_seq OR change IN ('pending>failed', 'pending>aborted', 'pending>cancelled', 'pending>orphaned', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'waiting>failed', 'waiting>aborted', 'waiting>cancelled', 'sleeping>failed', 'sleeping>aborted', 'sleeping>cancelled', 'completing>completed', 'completing>failed', 'completing>aborted'))
        AND (NEW.created_at IS NOT DISTINCT FROM OLD.created_at OR false)
        AND (NEW.started_at IS NOT DISTINCT FROM OLD.started_at OR (change IN ('pending>running') AND (OLD.started_at IS NULL)))
        AND (NEW.settled_at IS NOT DISTINCT FROM OLD.settled_at OR change IN ('pending>failed', 'pending>aborted', 'pending>cancelled', 'pending>orphaned', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'waiting>failed', 'waiting>aborted', 'waiting>cancelled', 'sleeping>failed', 'sleeping>aborted', 'sleeping>cancelled', 'completing>completed', 'completing>failed', 'completing>aborted'))
        AND (NEW.await_name IS NOT DISTINCT FROM OLD.await_name OR change IN ('running>sleeping'))
        AND (NEW.await_token IS NOT DISTINCT FROM OLD.await_token OR change IN ('running>sleeping'))
        AND (NEW.delivered IS NOT DISTINCT FROM OLD.delivered OR change IN ('running>sleeping', 'sleeping>pending'))
        AND (NEW.deadline IS NOT DISTINCT FROM OLD.deadline OR false)
        AND (NEW.forked_from IS NOT DISTINCT FROM OLD.forked_from OR false)
        AND (NEW.trace IS NOT DISTINCT FROM OLD.trace OR false)
        AND (NEW.tenant IS NOT DISTINCT FROM OLD.tenant OR false)
        AND (NEW.priority IS NOT DISTINCT FROM OLD.priority OR false)
        AND (NEW.queue_at IS NOT DISTINCT FROM OLD.queue_at OR false)
        AND (NEW.queue_expires_at IS NOT DISTINCT FROM OLD.queue_expires_at OR false)
        AND (NEW.concurrency_key IS NOT DISTINCT FROM OLD.concurrency_key OR false)
        AND (NEW.slots IS NOT DISTINCT FROM OLD.slots OR (change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'running>running') AND (change <> 'running>running' OR NEW.slots @> coalesce(OLD.slots, '{}'))))
        AND ((NEW.status = 'running') = (NEW.token IS NOT NULL))
        AND ((NEW.status = 'running') = (NEW.run_epoch IS NOT NULL))
        AND ((NEW.status = 'running') = (NEW.lease_expires_at IS NOT NULL))
        AND ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settle_seq IS NOT NULL))
        AND ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settled_at IS NOT NULL))
        AND (NOT NEW.abort_requested OR NEW.status IN ('aborted', 'orphaned'))
        AND (change <> 'running>sleeping' OR NEW.sleep_seq = OLD.sleep_seq + 1)
        AND (change <> 'pending>running' OR NEW.token IS DISTINCT FROM OLD.token)
        AND (NEW.status = 'running' OR NEW.slots IS NULL) THEN
        RETURN NEW;
    END IF;
    IF NOT (NEW.input IS NOT DISTINCT FROM OLD.input OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column input may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.phase IS NOT DISTINCT FROM OLD.phase OR change IN ('running>running', 'running>waiting', 'running>sleeping')) THEN
        RAISE EXCEPTION 'arbor: task %: column phase may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a checkpoint, or the phase a wait or a sleep saves';
    END IF;
    IF NOT (NEW.state IS NOT DISTINCT FROM OLD.state OR change IN ('running>running', 'running>waiting', 'running>sleeping')) THEN
        RAISE EXCEPTION 'arbor: task %: column state may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a checkpoint, or the state a wait or a sleep saves';
    END IF;
    IF NOT (NEW.result IS NOT DISTINCT FROM OLD.result OR change IN ('running>completing', 'running>completed', 'pending>cancelled', 'running>cancelled', 'waiting>cancelled', 'sleeping>cancelled')) THEN
        RAISE EXCEPTION 'arbor: task %: column result may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a completion (held while completing, kept when it completes) or a cancel';
    END IF;
    IF NOT (NEW.error IS NOT DISTINCT FROM OLD.error OR change IN ('running>sleeping', 'pending>failed', 'running>failed', 'waiting>failed', 'sleeping>failed', 'completing>failed', 'pending>cancelled', 'running>cancelled', 'waiting>cancelled', 'sleeping>cancelled', 'pending>aborted', 'running>aborted', 'waiting>aborted', 'sleeping>aborted', 'completing>aborted', 'pending>orphaned')) THEN
        RAISE EXCEPTION 'arbor: task %: column error may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a failure, retried or final, an abandon''s code, or an abort''s reason';
    END IF;
    IF NOT (NEW.attempt IS NOT DISTINCT FROM OLD.attempt OR (change IN ('running>pending') AND (NEW.attempt = OLD.attempt + 1))) THEN
        RAISE EXCEPTION 'arbor: task %: column attempt may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'one more per counted recovery (its holder died or lost its lease), and only then';
    END IF;
    IF NOT (NEW.restart_limit IS NOT DISTINCT FROM OLD.restart_limit OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column restart_limit may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.abandon_on_restart IS NOT DISTINCT FROM OLD.abandon_on_restart OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column abandon_on_restart may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.abort_requested IS NOT DISTINCT FROM OLD.abort_requested OR (change IN ('pending>aborted', 'running>aborted', 'waiting>aborted', 'sleeping>aborted', 'completing>aborted', 'pending>orphaned') AND (NEW.abort_requested))) THEN
        RAISE EXCEPTION 'arbor: task %: column abort_requested may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'set by an abort, as it settles the task';
    END IF;
    IF NOT (NEW.wait_policy IS NOT DISTINCT FROM OLD.wait_policy OR change IN ('running>waiting')) THEN
        RAISE EXCEPTION 'arbor: task %: column wait_policy may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a wait; kept after it for the resumed handler';
    END IF;
    IF NOT (NEW.wait_ids IS NOT DISTINCT FROM OLD.wait_ids OR change IN ('running>waiting')) THEN
        RAISE EXCEPTION 'arbor: task %: column wait_ids may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a wait; kept after it for the resumed handler';
    END IF;
    IF NOT (NEW.wake_at IS NOT DISTINCT FROM OLD.wake_at OR (change IN ('running>sleeping', 'waiting>pending', 'sleeping>pending') AND (NEW.wake_at IS NOT NULL OR NEW.await_name IS NOT NULL OR NEW.status = 'pending'))) THEN
        RAISE EXCEPTION 'arbor: task %: column wake_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a sleep or a retry''s backoff, or an await''s timeout (none for an await without one); an event delivered before the timeout clears it';
    END IF;
    IF NOT (NEW.sleep_seq IS NOT DISTINCT FROM OLD.sleep_seq OR (change IN ('running>sleeping') AND (NEW.sleep_seq = OLD.sleep_seq + 1))) THEN
        RAISE EXCEPTION 'arbor: task %: column sleep_seq may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'one more per sleep or await';
    END IF;
    IF NOT (NEW.max_retries IS NOT DISTINCT FROM OLD.max_retries OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column max_retries may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.retries IS NOT DISTINCT FROM OLD.retries OR (change IN ('running>sleeping') AND (NEW.retries = OLD.retries + 1))) THEN
        RAISE EXCEPTION 'arbor: task %: column retries may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'one more per retry';
    END IF;
    IF NOT (NEW.retry_backoff_base IS NOT DISTINCT FROM OLD.retry_backoff_base OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column retry_backoff_base may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.retry_backoff_cap IS NOT DISTINCT FROM OLD.retry_backoff_cap OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column retry_backoff_cap may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.error_history IS NOT DISTINCT FROM OLD.error_history OR change IN ('running>sleeping', 'pending>failed', 'running>failed', 'waiting>failed', 'sleeping>failed', 'completing>failed')) THEN
        RAISE EXCEPTION 'arbor: task %: column error_history may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'appended to by a failure';
    END IF;
    IF NOT (NEW.wake_job_id IS NOT DISTINCT FROM OLD.wake_job_id OR change IN ('running>sleeping', 'waiting>pending', 'sleeping>pending')) THEN
        RAISE EXCEPTION 'arbor: task %: column wake_job_id may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'the River job of a new sleep or await timeout; dropped with an event delivered before it';
    END IF;
    IF NOT (NEW.token IS NOT DISTINCT FROM OLD.token OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled')) THEN
        RAISE EXCEPTION 'arbor: task %: column token may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a fresh token when a run starts, none when it ends';
    END IF;
    IF NOT (NEW.run_epoch IS NOT DISTINCT FROM OLD.run_epoch OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled')) THEN
        RAISE EXCEPTION 'arbor: task %: column run_epoch may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'the lease epoch a run starts under, none when it ends';
    END IF;
    IF NOT (NEW.lease_expires_at IS NOT DISTINCT FROM OLD.lease_expires_at OR change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'running>running')) THEN
        RAISE EXCEPTION 'arbor: task %: column lease_expires_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a run''s task lease, extended by a checkpoint or heartbeat';
    END IF;
    IF NOT (NEW.idempotency_key IS NOT DISTINCT FROM OLD.idempotency_key OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column idempotency_key may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.settle_seq IS NOT DISTINCT FROM OLD.settle_seq OR change IN ('pending>failed', 'pending>aborted', 'pending>cancelled', 'pending>orphaned', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'waiting>failed', 'waiting>aborted', 'waiting>cancelled', 'sleeping>failed', 'sleeping>aborted', 'sleeping>cancelled', 'completing>completed', 'completing>failed', 'completing>aborted')) THEN
        RAISE EXCEPTION 'arbor: task %: column settle_seq may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'numbered when the task settles';
    END IF;
    IF NOT (NEW.created_at IS NOT DISTINCT FROM OLD.created_at OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column created_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.started_at IS NOT DISTINCT FROM OLD.started_at OR (change IN ('pending>running') AND (OLD.started_at IS NULL))) THEN
        RAISE EXCEPTION 'arbor: task %: column started_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'the first start, and only it';
    END IF;
    IF NOT (NEW.settled_at IS NOT DISTINCT FROM OLD.settled_at OR change IN ('pending>failed', 'pending>aborted', 'pending>cancelled', 'pending>orphaned', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'waiting>failed', 'waiting>aborted', 'waiting>cancelled', 'sleeping>failed', 'sleeping>aborted', 'sleeping>cancelled', 'completing>completed', 'completing>failed', 'completing>aborted')) THEN
        RAISE EXCEPTION 'arbor: task %: column settled_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'stamped when the task settles';
    END IF;
    IF NOT (NEW.await_name IS NOT DISTINCT FROM OLD.await_name OR change IN ('running>sleeping')) THEN
        RAISE EXCEPTION 'arbor: task %: column await_name may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'set by an await, cleared by a plain sleep (kept after the wake, for the resumed handler)';
    END IF;
    IF NOT (NEW.await_token IS NOT DISTINCT FROM OLD.await_token OR change IN ('running>sleeping')) THEN
        RAISE EXCEPTION 'arbor: task %: column await_token may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a fresh token with every await, none with a plain sleep';
    END IF;
    IF NOT (NEW.delivered IS NOT DISTINCT FROM OLD.delivered OR change IN ('running>sleeping', 'sleeping>pending')) THEN
        RAISE EXCEPTION 'arbor: task %: column delivered may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'what woke an await (the event, or its timeout), cleared when the task parks again: an event delivered to this task, carried as it was emitted, or a timeout with no event';
    END IF;
    IF NOT (NEW.deadline IS NOT DISTINCT FROM OLD.deadline OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column deadline may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.forked_from IS NOT DISTINCT FROM OLD.forked_from OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column forked_from may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at insert: the task a fork copied';
    END IF;
    IF NOT (NEW.trace IS NOT DISTINCT FROM OLD.trace OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column trace may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'the trace context the task was created in, fixed at create';
    END IF;
    IF NOT (NEW.tenant IS NOT DISTINCT FROM OLD.tenant OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column tenant may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'its conversation''s tenant, which never changes';
    END IF;
    IF NOT (NEW.priority IS NOT DISTINCT FROM OLD.priority OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column priority may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.queue_at IS NOT DISTINCT FROM OLD.queue_at OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column queue_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create: created_at less the priority''s aging';
    END IF;
    IF NOT (NEW.queue_expires_at IS NOT DISTINCT FROM OLD.queue_expires_at OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column queue_expires_at may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'a queued turn''s time to live, fixed at create';
    END IF;
    IF NOT (NEW.concurrency_key IS NOT DISTINCT FROM OLD.concurrency_key OR false) THEN
        RAISE EXCEPTION 'arbor: task %: column concurrency_key may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'fixed at create';
    END IF;
    IF NOT (NEW.slots IS NOT DISTINCT FROM OLD.slots OR (change IN ('pending>running', 'running>pending', 'running>waiting', 'running>sleeping', 'running>completing', 'running>completed', 'running>failed', 'running>aborted', 'running>cancelled', 'running>running') AND (change <> 'running>running' OR NEW.slots @> coalesce(OLD.slots, '{}')))) THEN
        RAISE EXCEPTION 'arbor: task %: column slots may not change so on %', OLD.id, change
            USING ERRCODE = 'AB005', HINT = 'the concurrency limits a run holds a slot of: taken as it starts, given back as it ends (task_slots), or named by a limit set while it runs';
    END IF;
    IF NOT ((NEW.status = 'running') = (NEW.token IS NOT NULL)) THEN
        RAISE EXCEPTION 'arbor: task %: a token exactly while running (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT ((NEW.status = 'running') = (NEW.run_epoch IS NOT NULL)) THEN
        RAISE EXCEPTION 'arbor: task %: a run epoch exactly while running (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT ((NEW.status = 'running') = (NEW.lease_expires_at IS NOT NULL)) THEN
        RAISE EXCEPTION 'arbor: task %: a task lease exactly while running (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settle_seq IS NOT NULL)) THEN
        RAISE EXCEPTION 'arbor: task %: a settle number exactly when settled (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settled_at IS NOT NULL)) THEN
        RAISE EXCEPTION 'arbor: task %: a settle time exactly when settled (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT (NOT NEW.abort_requested OR NEW.status IN ('aborted', 'orphaned')) THEN
        RAISE EXCEPTION 'arbor: task %: only an abort marks a task, as it settles it (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT (change <> 'running>sleeping' OR NEW.sleep_seq = OLD.sleep_seq + 1) THEN
        RAISE EXCEPTION 'arbor: task %: every sleep has a number of its own (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT (change <> 'pending>running' OR NEW.token IS DISTINCT FROM OLD.token) THEN
        RAISE EXCEPTION 'arbor: task %: every start has a token of its own (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    IF NOT (NEW.status = 'running' OR NEW.slots IS NULL) THEN
        RAISE EXCEPTION 'arbor: task %: slots are held only while running (on %)', OLD.id, change
            USING ERRCODE = 'AB005';
    END IF;
    RETURN NEW;
END
$guard$;

-- Inserts and deletes are checked before the row is written; updates
-- after it, at the end of their statement (which a raise undoes just the
-- same): a BEFORE UPDATE row trigger locks each row it is given, a WAL
-- record per row updated (measured: one more per task of a runner's
-- claim and complete), and an AFTER one does not. Its checks that read
-- the table see the statement's other rows as written, as a statement
-- should be judged. Row triggers of one event fire in the order of their
-- names, and a foreign key's are named "RI_ConstraintTrigger_…": the
-- capital A puts the guard first, so that a forged key is refused as the
-- guard refuses it (AB003, AB007), not as the foreign key does.
DROP TRIGGER IF EXISTS task_guard ON {schema}.tasks;
CREATE TRIGGER task_guard
    BEFORE INSERT OR DELETE ON {schema}.tasks
    FOR EACH ROW EXECUTE FUNCTION {schema}.task_guard();
DROP TRIGGER IF EXISTS "Arbor_task_guard_update" ON {schema}.tasks;
CREATE TRIGGER "Arbor_task_guard_update"
    AFTER UPDATE ON {schema}.tasks
    FOR EACH ROW EXECUTE FUNCTION {schema}.task_guard();

CREATE OR REPLACE FUNCTION {schema}.task_guard_truncate() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: the tasks table cannot be truncated'
        USING ERRCODE = 'AB006';
END
$guard$;

DROP TRIGGER IF EXISTS task_guard_truncate ON {schema}.tasks;
CREATE TRIGGER task_guard_truncate
    BEFORE TRUNCATE ON {schema}.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.task_guard_truncate();

-- A conversation is inserted free, at epoch 0, stamped now. Its id and
-- birth never change, and its epoch only grows: by one, with
-- a new holder, when the lease is taken. Its holder changes only so (or to
-- none, a release). Its rows are deleted only by the prune, with no task
-- left and no live holder.
CREATE OR REPLACE FUNCTION {schema}.conversation_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT {schema}.prune_marked() THEN
            RAISE EXCEPTION 'arbor: conversation % cannot be deleted: only the prune path deletes', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        IF EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = OLD.id) THEN
            RAISE EXCEPTION 'arbor: conversation % cannot be deleted: it still has tasks', OLD.id
                USING ERRCODE = 'AB006';
        END IF;
        IF EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = OLD.holder_id AND h.expires_at >= now()) THEN
            RAISE EXCEPTION 'arbor: conversation % cannot be deleted: % holds its lease', OLD.id, OLD.holder
                USING ERRCODE = 'AB006';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.epoch <> 0 OR NEW.holder IS NOT NULL OR NEW.holder_id IS NOT NULL THEN
            RAISE EXCEPTION 'arbor: a conversation is inserted free, at epoch 0'
                USING ERRCODE = 'AB007';
        END IF;
        IF NEW.created_at <> now() THEN
            RAISE EXCEPTION 'arbor: a conversation is inserted stamped now by the database, not at %', NEW.created_at
                USING ERRCODE = 'AB007';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id <> OLD.id OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'arbor: conversation %: its id and created_at never change', OLD.id
            USING ERRCODE = 'AB007';
    END IF;
    IF NEW.epoch <> OLD.epoch AND NOT (NEW.epoch = OLD.epoch + 1 AND NEW.holder_id IS NOT NULL) THEN
        RAISE EXCEPTION 'arbor: conversation %: the epoch moves by one, when a holder takes the lease (% -> %)', OLD.id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'AB007';
    END IF;
    IF (NEW.holder IS NULL) <> (NEW.holder_id IS NULL) THEN
        RAISE EXCEPTION 'arbor: conversation %: a holder has a name and a row, or neither', OLD.id
            USING ERRCODE = 'AB007';
    END IF;
    IF (NEW.holder_id IS DISTINCT FROM OLD.holder_id OR NEW.holder IS DISTINCT FROM OLD.holder)
        AND NEW.holder_id IS NOT NULL AND NEW.epoch = OLD.epoch THEN
        RAISE EXCEPTION 'arbor: conversation %: a new holder takes the lease with a new epoch', OLD.id
            USING ERRCODE = 'AB007';
    END IF;
    RETURN NEW;
END
$guard$;

-- As task_guard: updates checked after the row is written.
DROP TRIGGER IF EXISTS conversation_guard ON {schema}.conversations;
CREATE TRIGGER conversation_guard
    BEFORE INSERT OR DELETE ON {schema}.conversations
    FOR EACH ROW EXECUTE FUNCTION {schema}.conversation_guard();
DROP TRIGGER IF EXISTS "Arbor_conversation_guard_update" ON {schema}.conversations;
CREATE TRIGGER "Arbor_conversation_guard_update"
    AFTER UPDATE ON {schema}.conversations
    FOR EACH ROW EXECUTE FUNCTION {schema}.conversation_guard();

-- A conversation's lease changes hands only as arbor's own paths change it:
--   - a release (its holder to none) leaves none of its tasks running:
--     every release of arbor's recovers the holder's runs first, in the
--     same transaction (a Lease's Release, a runner's release at shutdown
--     or for room, one by one), or frees only conversations with nothing
--     running (the idle release);
--   - a new holder takes the lease from none or from a holder whose row
--     has expired, never from a live one (an open and a Lease's take-over
--     test the same: "free to take" in store/queries/lease.sql).
-- Either by hand would let another node claim a task whose run the live
-- holder's handler is still making: two calls of the task at once.
-- Checked after the row is written, and only when a holder gives way (the
-- WHEN clause, evaluated without calling the function: a conversation's
-- first open, from none, costs nothing). now() is the transaction's
-- start, as in the statements it checks.
CREATE OR REPLACE FUNCTION {schema}.conversation_handover_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF NEW.holder_id IS NULL THEN
        IF EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = NEW.id AND t.status = 'running') THEN
            RAISE EXCEPTION 'arbor: conversation %: released with a task running (a release recovers its holder''s runs first)', NEW.id
                USING ERRCODE = 'AB007';
        END IF;
    ELSIF EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = OLD.holder_id AND h.expires_at >= now()) THEN
        RAISE EXCEPTION 'arbor: conversation %: taken from %, whose lease is live', NEW.id, OLD.holder
            USING ERRCODE = 'AB007';
    END IF;
    RETURN NULL;
END
$guard$;

DROP TRIGGER IF EXISTS "Arbor_conversation_handover_guard" ON {schema}.conversations;
CREATE TRIGGER "Arbor_conversation_handover_guard"
    AFTER UPDATE OF holder_id ON {schema}.conversations
    FOR EACH ROW WHEN (OLD.holder_id IS NOT NULL AND OLD.holder_id IS DISTINCT FROM NEW.holder_id)
    EXECUTE FUNCTION {schema}.conversation_handover_guard();
-- END arbor:guard
