-- arbor's schema, v0.1.0: every table, index, function and trigger arbor
-- needs, in one migration, each named in the schema arbor was given (the
-- file in arbor's repository writes a placeholder, which `arbor migrate
-- print` and the migrator fill in). River's tables are not here: the
-- migrator applies River's own migrations, in the same schema, after
-- arbor's (docs/operations.md).
--
-- Every table carries conversation_id, and every query filters by it, so
-- the schema can be distributed by conversation_id (docs/design.md §8).
-- The guards generated from fsm's rules are written whole below, between
-- their BEGIN and END lines, by `go generate ./fsm`.

-- A runner's life (docs/design.md §3.8): a conversation's lease names the
-- holder row, and a holder whose row expired holds nothing.
CREATE TABLE {schema}.holders (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> '' AND octet_length(name) <= 200),
    expires_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

-- The maintenance leader (docs/architecture.md, "One runner maintains the
-- schema"). The schema-wide scans of the runners' maintenance (deadlines,
-- wall-time budgets, unknown kinds, lapsed reservations, holder rows of
-- lives long over) run on one runner per schema: the runner whose holder
-- row (a life, in the holders table) this one row names, for as long as
-- that row is live. Its lease is its holder row's lease: no second renewal, and a
-- leader that dies, is frozen or loses the database loses the leadership
-- when its holder row expires, as it loses its conversations. A runner
-- takes the leadership only while the row names no live holder, with a
-- holder row of its own that is live (internal/store's ElectLeader): at
-- most one live holder leads.
--
-- One row, or none: a runner that finds none inserts it.
CREATE TABLE {schema}.maintenance_leader (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    holder_id  bigint,
    elected_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.maintenance_leader (holder_id) VALUES (NULL);

CREATE TABLE {schema}.conversations (
    id         text        PRIMARY KEY CHECK (id <> '' AND octet_length(id) <= 200),
    -- The holder's name, kept beside holder_id for readers; null when free.
    holder     text,
    -- Grows with every take-over; every write a runner makes is fenced by it.
    epoch      bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    holder_id  bigint      REFERENCES {schema}.holders (id)
) WITH (fillfactor = 70);

-- A node's claims across the conversations it holds start from this
-- index, and so do the take-overs of a lapsed holder's conversations.
CREATE INDEX conversations_holder_idx ON {schema}.conversations (holder_id) WHERE holder_id IS NOT NULL;

-- A fresh fencing token for every start of a task: no two starts share one.
CREATE SEQUENCE {schema}.task_token_seq;

-- The order in which tasks settle. Every settle holds the conversation row
-- lock, so within a conversation this is commit order: "children before
-- parents" can be checked after the fact.
CREATE SEQUENCE {schema}.task_settle_seq;

CREATE TABLE {schema}.tasks (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id    text        NOT NULL REFERENCES {schema}.conversations (id),
    owner_task_id      bigint,
    kind               text        NOT NULL CHECK (kind <> '' AND octet_length(kind) <= 200),
    status             text        NOT NULL DEFAULT 'pending' CHECK (status IN
        ('pending', 'running', 'waiting', 'sleeping', 'completing',
         'completed', 'failed', 'aborted', 'cancelled', 'orphaned')),
    background         boolean     NOT NULL DEFAULT false,
    input              jsonb,
    phase              text        NOT NULL DEFAULT '',
    state              jsonb,
    result             jsonb,
    error              jsonb,
    attempt            integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    restart_limit      integer     NOT NULL DEFAULT 5 CHECK (restart_limit >= 0),
    abandon_on_restart boolean     NOT NULL DEFAULT false,
    abort_requested    boolean     NOT NULL DEFAULT false,
    -- The wait of a waiting task (docs/design.md §3.4).
    wait_policy        text        CHECK (wait_policy IN ('all_settled', 'fail_fast')),
    wait_ids           bigint[],
    -- The sleep of a sleeping task (docs/design.md §3.7): its time, and
    -- which sleep it is.
    wake_at            timestamptz,
    sleep_seq          bigint      NOT NULL DEFAULT 0,
    -- Retries under the task's retry policy, separate from attempt.
    max_retries        integer     NOT NULL DEFAULT 0 CHECK (max_retries >= 0),
    retries            integer     NOT NULL DEFAULT 0 CHECK (retries >= 0),
    -- The run that holds a running task: its fencing token and lease deadline.
    token              bigint,
    lease_expires_at   timestamptz,
    idempotency_key    text        CHECK (octet_length(idempotency_key) <= 200),
    settle_seq         bigint,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    settled_at         timestamptz,
    -- The River job that wakes a sleeping task.
    wake_job_id        bigint,
    retry_backoff_base interval    NOT NULL DEFAULT '1 second' CHECK (retry_backoff_base >= '0'),
    retry_backoff_cap  interval    NOT NULL DEFAULT '5 minutes',
    error_history      jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(error_history) = 'array'),
    -- The conversation's epoch the run started under: a run of an older
    -- epoch is a take-over's leftover (docs/design.md §4, invariant 8).
    run_epoch          bigint,
    -- The await of a sleeping task: the event it waits for, the token that
    -- completes it from outside, what was delivered, and its deadline.
    await_name         text        CHECK (await_name <> '' AND octet_length(await_name) <= 200),
    await_token        text,
    delivered          jsonb,
    deadline           timestamptz,
    -- The settled task of another conversation this one is a copy of.
    forked_from        bigint,
    -- The caller's trace context, carried to every run of the task.
    trace              jsonb       CHECK (jsonb_typeof(trace) = 'object' AND octet_length(trace::text) <= 4096),
    CONSTRAINT tasks_check CHECK (owner_task_id IS NULL OR owner_task_id < id),
    CONSTRAINT tasks_check1 CHECK (retry_backoff_cap >= retry_backoff_base),
    -- Owner and child share the conversation: the composite key makes it a fact.
    UNIQUE (conversation_id, id),
    FOREIGN KEY (conversation_id, owner_task_id) REFERENCES {schema}.tasks (conversation_id, id)
);

-- Claiming pending tasks across conversations, oldest first (within one
-- conversation, tasks_conversation_live_idx serves).
CREATE INDEX tasks_pending_idx ON {schema}.tasks (id) WHERE status = 'pending';
-- Live children of an owner (waits, completing, abort, reconcile).
CREATE INDEX tasks_live_children_idx ON {schema}.tasks (owner_task_id)
    WHERE owner_task_id IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- A repeated create with the same key returns the existing task.
CREATE UNIQUE INDEX tasks_idempotency_key_idx ON {schema}.tasks (conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- A conversation's live tasks (recovery, the invariant checker, the CLI).
CREATE INDEX tasks_conversation_live_idx ON {schema}.tasks (conversation_id, status)
    WHERE status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- Sleeps due soon, across conversations: what a waker arms its timers from.
CREATE INDEX tasks_sleeping_wake_idx ON {schema}.tasks (wake_at) WHERE status = 'sleeping';
-- An await completed from outside by its token.
CREATE UNIQUE INDEX tasks_await_token_idx ON {schema}.tasks (await_token) WHERE await_token IS NOT NULL;
-- The tasks of a conversation that await an event of a name.
CREATE INDEX tasks_awaiting_idx ON {schema}.tasks (conversation_id, await_name, id)
    WHERE status = 'sleeping' AND await_name IS NOT NULL;
-- Live tasks whose deadline is due.
CREATE INDEX tasks_deadline_idx ON {schema}.tasks (deadline)
    WHERE deadline IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- The prune walks settled turns (root tasks) oldest first, across
-- conversations.
CREATE INDEX tasks_settled_roots_idx ON {schema}.tasks (settled_at, id)
    WHERE owner_task_id IS NULL AND settled_at IS NOT NULL;
-- Deleting a task checks that nothing refers to it (the ownership and the
-- events' foreign keys): without these, each deleted row would scan its
-- conversation's tasks and the whole events table.
CREATE INDEX tasks_owner_idx ON {schema}.tasks (conversation_id, owner_task_id)
    WHERE owner_task_id IS NOT NULL;

-- Events emitted to a conversation or a task, and which task each was
-- delivered to (docs/design.md §3.6).
CREATE TABLE {schema}.events (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id text        NOT NULL REFERENCES {schema}.conversations (id),
    task_id         bigint,
    name            text        NOT NULL CHECK (name <> '' AND octet_length(name) <= 200),
    payload         jsonb,
    idempotency_key text        CHECK (octet_length(idempotency_key) <= 200),
    queued          boolean     NOT NULL,
    emitted_at      timestamptz NOT NULL DEFAULT now(),
    delivered_to    bigint,
    delivered_at    timestamptz,
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id),
    FOREIGN KEY (conversation_id, delivered_to) REFERENCES {schema}.tasks (conversation_id, id),
    CONSTRAINT events_check CHECK ((delivered_to IS NULL) = (delivered_at IS NULL))
);
CREATE UNIQUE INDEX events_key_idx ON {schema}.events (conversation_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_undelivered_idx ON {schema}.events (conversation_id, name, id) WHERE delivered_to IS NULL;
CREATE INDEX events_first_idx ON {schema}.events (conversation_id, name, (coalesce(task_id, 0))) WHERE NOT queued;
CREATE INDEX events_task_idx ON {schema}.events (conversation_id, task_id) WHERE task_id IS NOT NULL;
CREATE INDEX events_delivered_to_idx ON {schema}.events (conversation_id, delivered_to) WHERE delivered_to IS NOT NULL;

-- The conversation's log: every status change, progress report and
-- delivered event, in commit order per conversation.
CREATE SEQUENCE {schema}.log_seq;
CREATE TABLE {schema}.conversation_log (
    seq             bigint      PRIMARY KEY DEFAULT nextval('{schema}.log_seq'),
    conversation_id text        NOT NULL,
    task_id         bigint,
    kind            text        NOT NULL CHECK (kind IN ('status', 'progress', 'event')),
    status          text,
    name            text,
    payload         jsonb,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX conversation_log_conversation_idx ON {schema}.conversation_log (conversation_id, seq);

-- Budgets (docs/design.md §3.11): a counter's limit and its sums, for a
-- conversation (task_id null) or a task's subtree.
CREATE TABLE {schema}.budgets (
    conversation_id text        NOT NULL REFERENCES {schema}.conversations (id),
    task_id         bigint,
    counter         text        NOT NULL CHECK (counter ~ '^[a-z][a-z0-9_.]{0,62}$'),
    max             bigint      CHECK (max >= 0),
    spent           bigint      NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved        bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    carried         bigint      NOT NULL DEFAULT 0 CHECK (carried >= 0),
    on_exhausted    text        NOT NULL DEFAULT 'fail' CHECK (on_exhausted IN ('fail', 'park', 'return')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id)
);
CREATE UNIQUE INDEX budgets_scope_idx ON {schema}.budgets (conversation_id, counter, (coalesce(task_id, 0)));
CREATE INDEX budgets_wall_idx ON {schema}.budgets (conversation_id) WHERE counter = 'wall_ms' AND max IS NOT NULL;

-- What a run reserved of a counter, and, once closed, what it spent.
CREATE TABLE {schema}.budget_reservations (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id text        NOT NULL,
    task_id         bigint      NOT NULL,
    counter         text        NOT NULL,
    run_token       bigint      NOT NULL,
    idempotency_key text        NOT NULL CHECK (octet_length(idempotency_key) <= 200),
    amount          bigint      NOT NULL CHECK (amount >= 0),
    actual          bigint      CHECK (actual >= 0),
    lapsed          boolean     NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    closed_at       timestamptz,
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id),
    CONSTRAINT budget_reservations_check CHECK ((actual IS NULL) = (closed_at IS NULL)),
    CONSTRAINT budget_reservations_check1 CHECK (NOT lapsed OR actual = amount)
);
CREATE UNIQUE INDEX budget_reservations_key_idx ON {schema}.budget_reservations (conversation_id, task_id, idempotency_key);
CREATE INDEX budget_reservations_open_idx ON {schema}.budget_reservations (conversation_id, counter) WHERE actual IS NULL;

-- The prune's marks: a transaction that deletes history inserts its own
-- id here first, and removes it before it commits (prune_marked()).
CREATE TABLE {schema}.prune_marks (
    txid xid8 PRIMARY KEY DEFAULT pg_current_xact_id()
);

-- Whether the current transaction is the prune's: it inserted its id
-- into prune_marks. A transaction with no id yet (it wrote nothing) is
-- not; pg_current_xact_id_if_assigned() does not give it one.
CREATE FUNCTION {schema}.prune_marked() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.prune_marks WHERE txid = pg_current_xact_id_if_assigned())
$$;

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
            AND NEW.created_at = now()) THEN
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
            IF NOT (NEW.created_at = now()) THEN
                RAISE EXCEPTION 'arbor: a task is inserted as a fresh pending task: NEW.created_at = now() does not hold'
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
        AND ((NEW.status = 'running') = (NEW.token IS NOT NULL))
        AND ((NEW.status = 'running') = (NEW.run_epoch IS NOT NULL))
        AND ((NEW.status = 'running') = (NEW.lease_expires_at IS NOT NULL))
        AND ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settle_seq IS NOT NULL))
        AND ((NEW.status IN ('completed', 'failed', 'aborted', 'cancelled', 'orphaned')) = (NEW.settled_at IS NOT NULL))
        AND (NOT NEW.abort_requested OR NEW.status IN ('aborted', 'orphaned'))
        AND (change <> 'running>sleeping' OR NEW.sleep_seq = OLD.sleep_seq + 1)
        AND (change <> 'pending>running' OR NEW.token IS DISTINCT FROM OLD.token) THEN
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

-- BEGIN arbor:records (written by go generate ./fsm from package fsm; do not edit)
-- Code generated by go generate ./fsm; DO NOT EDIT.
-- The database's copy of arbor's rules for its records (internal/guardrules/records.go;
-- docs/state-machine.md): what a new row of each looks like, which of its
-- columns never change and which change only so, and when a row is
-- deleted. A refusal raises AB009 (guardrules.SQLStateRecord), a delete off its
-- path or a TRUNCATE AB006 (guardrules.SQLStateDelete); the engine reports both
-- as ErrInvalidTransition.

-- A delete on the prune path only; never a TRUNCATE. Shared by the tables
-- whose rule has no delete of its own.
CREATE OR REPLACE FUNCTION {schema}.record_guard_delete() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF NOT coalesce({schema}.prune_marked(), false) THEN
        RAISE EXCEPTION 'arbor: a row of %.% is deleted only by the prune', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'AB006';
    END IF;
    RETURN OLD;
END
$guard$;

CREATE OR REPLACE FUNCTION {schema}.record_guard_truncate() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: the % table cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'AB006';
END
$guard$;

-- events: an event is inserted by an emit (undelivered, stamped now) or by
-- a fork as a copy, in the fork's own transaction (it names forked tasks
-- only, the copies of the task it was addressed or delivered to, and is
-- their source's event field for field); it changes once, when it is
-- delivered: to the task it is addressed to (or, addressed to the
-- conversation, to any of its tasks), which is parked in an await of its
-- name (the delivery comes before the task's wake, in the same
-- transaction), stamped greatest(now(), its emission) so that its stamps
-- follow the conversation lock's order; nothing else of it ever changes
CREATE OR REPLACE FUNCTION {schema}.event_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT coalesce((NEW.delivered_to IS NULL AND NEW.emitted_at = now())
            OR ((SELECT c.created_at FROM {schema}.conversations c WHERE c.id = NEW.conversation_id) = now()
            AND (NEW.task_id IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.task_id
                AND t.conversation_id = NEW.conversation_id AND t.forked_from IS NOT NULL))
            AND (NEW.delivered_to IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.delivered_to
                AND t.conversation_id = NEW.conversation_id AND t.forked_from IS NOT NULL))
            AND (NEW.task_id IS NULL OR NEW.delivered_to IS NULL OR NEW.delivered_to = NEW.task_id)
            AND EXISTS (SELECT 1 FROM {schema}.tasks ct JOIN {schema}.tasks st ON st.id = ct.forked_from
                WHERE ct.id = coalesce(NEW.task_id, NEW.delivered_to) AND ct.conversation_id = NEW.conversation_id
                AND CASE WHEN NEW.task_id IS NOT NULL
                    THEN EXISTS (SELECT 1 FROM {schema}.events s WHERE s.conversation_id = st.conversation_id AND s.task_id = st.id
                        AND (s.delivered_to IS NULL) = (NEW.delivered_to IS NULL) AND (s.delivered_to IS NULL OR s.delivered_to = st.id)
                        AND s.name = NEW.name AND s.payload IS NOT DISTINCT FROM NEW.payload
                        AND s.idempotency_key IS NOT DISTINCT FROM NEW.idempotency_key AND s.queued = NEW.queued
                        AND s.emitted_at = NEW.emitted_at AND s.delivered_at IS NOT DISTINCT FROM NEW.delivered_at)
                    ELSE EXISTS (SELECT 1 FROM {schema}.events s WHERE s.conversation_id = st.conversation_id AND s.delivered_to = st.id
                        AND s.task_id IS NULL
                        AND s.name = NEW.name AND s.payload IS NOT DISTINCT FROM NEW.payload
                        AND s.idempotency_key IS NOT DISTINCT FROM NEW.idempotency_key AND s.queued = NEW.queued
                        AND s.emitted_at = NEW.emitted_at AND s.delivered_at IS NOT DISTINCT FROM NEW.delivered_at) END)), false) THEN
            RAISE EXCEPTION 'arbor: an event is inserted undelivered by an emit, or as a fork''s copy of one'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
        OR NEW.conversation_id IS DISTINCT FROM OLD.conversation_id
        OR NEW.task_id IS DISTINCT FROM OLD.task_id
        OR NEW.name IS DISTINCT FROM OLD.name
        OR NEW.payload IS DISTINCT FROM OLD.payload
        OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
        OR NEW.queued IS DISTINCT FROM OLD.queued
        OR NEW.emitted_at IS DISTINCT FROM OLD.emitted_at THEN
        RAISE EXCEPTION 'arbor: event %: only its delivery ever changes', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.delivered_to IS DISTINCT FROM OLD.delivered_to OR NEW.delivered_at IS DISTINCT FROM OLD.delivered_at)
        AND NOT coalesce(OLD.delivered_to IS NULL AND NEW.delivered_to IS NOT NULL AND NEW.delivered_at = greatest(now(), OLD.emitted_at), false) THEN
        RAISE EXCEPTION 'arbor: event %: it is delivered once, stamped now, and never undelivered', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.delivered_to IS DISTINCT FROM OLD.delivered_to OR NEW.delivered_at IS DISTINCT FROM OLD.delivered_at)
        AND NOT coalesce((OLD.task_id IS NULL OR OLD.task_id = NEW.delivered_to)
            AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.delivered_to AND t.conversation_id = NEW.conversation_id
                AND t.status = 'sleeping' AND t.await_name = NEW.name), false) THEN
        RAISE EXCEPTION 'arbor: event % is delivered only to a task of its address that awaits it (task %)', OLD.id, NEW.delivered_to
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

-- conversation_log: the log is append-only: an entry, once written, never
-- changes (what an insert may write is the log's INSERT check)
CREATE OR REPLACE FUNCTION {schema}.log_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    RAISE EXCEPTION 'arbor: log entry % is never changed (conversation_log is append-only)', OLD.seq
        USING ERRCODE = 'AB009';
END
$guard$;

-- budgets: a budget is inserted with nothing carried, stamped now (what its
-- scope spent and holds already is counted by the insert itself); its scope
-- and counter never change; its spend only grows (a reservation's close, a
-- spend); carried grows only on the prune path (the spend of the pruned
-- tasks' reservations, carried into the conversation's budget); its max and
-- action are the user's to set (SetBudget); spent and reserved agree with
-- its reservations at commit
CREATE OR REPLACE FUNCTION {schema}.budget_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT coalesce((NEW.carried = 0 AND NEW.created_at = now()), false) THEN
            RAISE EXCEPTION 'arbor: a budget is inserted with nothing carried, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.conversation_id IS DISTINCT FROM OLD.conversation_id
        OR NEW.task_id IS DISTINCT FROM OLD.task_id
        OR NEW.counter IS DISTINCT FROM OLD.counter
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'arbor: budget % of %: its scope and counter never change', OLD.counter, OLD.conversation_id
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.spent IS DISTINCT FROM OLD.spent)
        AND NOT coalesce(NEW.spent > OLD.spent, false) THEN
        RAISE EXCEPTION 'arbor: budget % of %: its spend only grows (% -> %)', OLD.counter, OLD.conversation_id, OLD.spent, NEW.spent
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.carried IS DISTINCT FROM OLD.carried)
        AND NOT coalesce(NEW.carried > OLD.carried AND NEW.task_id IS NULL AND {schema}.prune_marked(), false) THEN
        RAISE EXCEPTION 'arbor: budget % of %: only the prune carries spend, into the conversation''s budget', OLD.counter, OLD.conversation_id
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

-- budget_reservations: a reservation is made by a run of its task (the task
-- running, with the reservation's token), stamped now, open or (a spend)
-- closed at once; it changes once, when it is closed (a record, or in full,
-- lapsed, once its run is over; the record is fenced by the close itself,
-- not by the run still holding the task: core.RecordBudget); nothing else
-- of it ever changes
CREATE OR REPLACE FUNCTION {schema}.reservation_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT coalesce((NEW.created_at = now() AND NOT NEW.lapsed AND (NEW.actual IS NULL OR (NEW.actual = NEW.amount AND NEW.closed_at = now()))
            AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.task_id AND t.conversation_id = NEW.conversation_id
                AND t.status = 'running' AND t.token = NEW.run_token)), false) THEN
            RAISE EXCEPTION 'arbor: a reservation is made by a run of its task, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
        OR NEW.conversation_id IS DISTINCT FROM OLD.conversation_id
        OR NEW.task_id IS DISTINCT FROM OLD.task_id
        OR NEW.counter IS DISTINCT FROM OLD.counter
        OR NEW.run_token IS DISTINCT FROM OLD.run_token
        OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
        OR NEW.amount IS DISTINCT FROM OLD.amount
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'arbor: reservation %: only its close ever changes', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.actual IS DISTINCT FROM OLD.actual OR NEW.lapsed IS DISTINCT FROM OLD.lapsed OR NEW.closed_at IS DISTINCT FROM OLD.closed_at)
        AND NOT coalesce(OLD.actual IS NULL AND NEW.actual IS NOT NULL AND NEW.closed_at = now(), false) THEN
        RAISE EXCEPTION 'arbor: reservation %: it is closed once, stamped now, and never reopened', OLD.id
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;

-- holders: a holder row (a node's lease) is inserted live, stamped now;
-- only its renewal changes it, and only while it is live: its deadline
-- never comes closer (a deadline brought back lapses a holder whose
-- handlers still run, and another node would take its conversations over
-- under them) and it is stamped renewed now; its name, id and birth never
-- change; a lease is at most a day; it is deleted only once no conversation
-- names it
CREATE OR REPLACE FUNCTION {schema}.holder_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT coalesce(NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = OLD.id), false) THEN
            RAISE EXCEPTION 'arbor: holder % (%) is deleted only once it holds no conversation', OLD.id, OLD.name
                USING ERRCODE = 'AB006';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT coalesce((NEW.created_at = now() AND NEW.renewed_at = now() AND NEW.expires_at >= now() AND NEW.expires_at <= now() + interval '24 hours'), false) THEN
            RAISE EXCEPTION 'arbor: a holder is inserted live, stamped now, for at most a day'
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
        OR NEW.name IS DISTINCT FROM OLD.name
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'arbor: holder % (%): only its renewal ever changes', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.expires_at IS DISTINCT FROM OLD.expires_at OR NEW.renewed_at IS DISTINCT FROM OLD.renewed_at)
        AND NOT coalesce(OLD.expires_at >= now() AND NEW.expires_at >= OLD.expires_at AND NEW.renewed_at = now(), false) THEN
        RAISE EXCEPTION 'arbor: holder % (%) is renewed only while live, stamped now, and its deadline never comes closer', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF (NEW.expires_at IS DISTINCT FROM OLD.expires_at)
        AND NOT coalesce(NEW.expires_at <= now() + interval '24 hours', false) THEN
        RAISE EXCEPTION 'arbor: holder % (%): a lease is at most a day, not until %', OLD.id, OLD.name, NEW.expires_at
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;
-- END arbor:records

-- The record guards' triggers. Inserts and truncates are checked before
-- the row is written; updates and deletes after it, at the end of their
-- statement, as the tasks' guard does (a BEFORE UPDATE row trigger locks
-- each row it is given: a WAL record per row); a holder's row, written
-- once per lease renewal, is checked before.
CREATE TRIGGER holder_guard BEFORE INSERT OR DELETE OR UPDATE ON {schema}.holders
    FOR EACH ROW EXECUTE FUNCTION {schema}.holder_guard();
CREATE TRIGGER holder_guard_truncate BEFORE TRUNCATE ON {schema}.holders
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

CREATE TRIGGER event_guard BEFORE INSERT ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
CREATE TRIGGER "Arbor_event_guard_update" AFTER UPDATE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.event_guard();
CREATE TRIGGER "Arbor_event_guard_delete" AFTER DELETE ON {schema}.events
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER event_guard_truncate BEFORE TRUNCATE ON {schema}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

CREATE TRIGGER "Arbor_log_guard" AFTER UPDATE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_guard();
CREATE TRIGGER "Arbor_log_guard_delete" AFTER DELETE ON {schema}.conversation_log
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER log_guard_truncate BEFORE TRUNCATE ON {schema}.conversation_log
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

CREATE TRIGGER budget_guard BEFORE INSERT ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();
CREATE TRIGGER "Arbor_budget_guard_update" AFTER UPDATE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.budget_guard();
CREATE TRIGGER "Arbor_budget_guard_delete" AFTER DELETE ON {schema}.budgets
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER budget_guard_truncate BEFORE TRUNCATE ON {schema}.budgets
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

CREATE TRIGGER reservation_guard BEFORE INSERT ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();
CREATE TRIGGER "Arbor_reservation_guard_update" AFTER UPDATE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.reservation_guard();
CREATE TRIGGER "Arbor_reservation_guard_delete" AFTER DELETE ON {schema}.budget_reservations
    FOR EACH ROW EXECUTE FUNCTION {schema}.record_guard_delete();
CREATE TRIGGER reservation_guard_truncate BEFORE TRUNCATE ON {schema}.budget_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.record_guard_truncate();

-- The prune's mark names the transaction that inserts it, and nothing
-- else: else a role granted INSERT on prune_marks (the runtime role) could
-- insert marks for transaction ids not yet given out, and a later
-- transaction of a role without that grant would be "marked" and delete
-- history. A mark is inserted as its transaction's own id (store.MarkPrune
-- inserts the default) and never changed; any other id, or an update, is
-- refused (AB009, guardrules.SQLStateRecord).
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

-- Run.Reserve, Run.Spend and Run.Record in one round trip each. These
-- two functions are the common path of internal/core/budget.go as one
-- statement each (store/budget.go: ReserveAtOnce, RecordAtOnce), called
-- outside any transaction, so that each commits on its own. They take the
-- same locks in the same order as the engine's transactions (the reserving
-- task FOR SHARE, then the counter's budgets FOR UPDATE ordered by counter
-- and scope, the conversation's first: docs/design.md §5, §3.11) and
-- write the same rows; the record guards check them as they check the
-- engine's. Each statement of a function sees what
-- committed before it began (a fresh snapshot per statement, as in the
-- engine's READ COMMITTED transactions), so what is read after the locks
-- is what the locks hold still.
--
-- budget_reserve decides only the common path: a reservation (or, with
-- p_spend, a spend) within every budget of its counter above the task,
-- with no reservation of the counter in the conversation whose run is
-- over. Anything else it leaves to the engine with nothing written,
-- outcome 'rare': a budget over (fail, park, return) or a wall-time
-- budget run out, a counter no budget names, a lapsed reservation to
-- close. Its other outcomes: 'reserved' (the new reservation), 'again'
-- (the task's reservation of that key, made before: a write retried after
-- a lost answer), 'no_task' (no such task in the conversation), 'not_held'
-- (the run no longer holds the task: its status and token are returned
-- for the engine's error). Wall time is the milliseconds since the
-- scope's creation, truncated, as the engine counts it.
CREATE FUNCTION {schema}.budget_reserve(p_conversation text, p_task bigint, p_token bigint, p_counter text,
        p_amount bigint, p_key text, p_spend boolean,
        OUT outcome text, OUT task_status text, OUT task_token bigint,
        OUT r_id bigint, OUT r_conversation text, OUT r_task bigint, OUT r_counter text, OUT r_token bigint,
        OUT r_key text, OUT r_amount bigint, OUT r_actual bigint, OUT r_lapsed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    scopes bigint[];
    born timestamptz[];
BEGIN
    SELECT t.status, coalesce(t.token, 0) INTO task_status, task_token
    FROM {schema}.tasks t WHERE t.id = p_task AND t.conversation_id = p_conversation
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'no_task';
        RETURN;
    END IF;
    SELECT r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed
    FROM {schema}.budget_reservations r
    WHERE r.conversation_id = p_conversation AND r.task_id = p_task AND r.idempotency_key = p_key;
    IF FOUND THEN
        outcome := 'again';
        RETURN;
    END IF;
    IF task_status <> 'running' OR task_token <> p_token THEN
        outcome := 'not_held';
        RETURN;
    END IF;

    -- The scopes: the task, its owners up to the root, the conversation (0).
    WITH RECURSIVE chain (id, owner_task_id, created_at, depth) AS (
        SELECT t.id, t.owner_task_id, t.created_at, 0 FROM {schema}.tasks t
        WHERE t.conversation_id = p_conversation AND t.id = p_task
        UNION ALL
        SELECT t.id, t.owner_task_id, t.created_at, c.depth + 1 FROM chain c
        JOIN {schema}.tasks t ON t.conversation_id = p_conversation AND t.id = c.owner_task_id)
    SELECT array_agg(c.id ORDER BY c.depth), array_agg(c.created_at ORDER BY c.depth) INTO scopes, born FROM chain c;
    scopes := scopes || 0::bigint;
    born := born || (SELECT cv.created_at FROM {schema}.conversations cv WHERE cv.id = p_conversation);

    -- Every budget of the counter and of wall time in the conversation, in
    -- the one order every writer locks them.
    PERFORM FROM (SELECT FROM {schema}.budgets b
        WHERE b.conversation_id = p_conversation AND b.counter IN (p_counter, 'wall_ms')
        ORDER BY b.counter, coalesce(b.task_id, 0)
        FOR UPDATE) locked;

    IF EXISTS (SELECT FROM {schema}.budget_reservations r
            JOIN {schema}.tasks t ON t.conversation_id = r.conversation_id AND t.id = r.task_id
            WHERE r.conversation_id = p_conversation AND r.counter = p_counter AND r.actual IS NULL
              AND NOT (t.status = 'running' AND t.token IS NOT DISTINCT FROM r.run_token))
        OR NOT EXISTS (SELECT FROM {schema}.budgets b WHERE b.conversation_id = p_conversation AND b.counter = p_counter)
        OR EXISTS (SELECT FROM unnest(scopes, born) s (scope, created_at)
            JOIN {schema}.budgets b ON b.conversation_id = p_conversation AND b.counter IN (p_counter, 'wall_ms')
                AND coalesce(b.task_id, 0) = s.scope
            WHERE b.max IS NOT NULL
              AND CASE WHEN b.counter = 'wall_ms'
                  THEN trunc(extract(epoch FROM now() - s.created_at) * 1000) >= b.max
                  ELSE p_amount > b.max - b.spent - b.reserved END) THEN
        outcome := 'rare';
        RETURN;
    END IF;

    UPDATE {schema}.budgets b
    SET reserved = b.reserved + CASE WHEN p_spend THEN 0 ELSE p_amount END,
        spent = b.spent + CASE WHEN p_spend THEN p_amount ELSE 0 END,
        updated_at = now()
    WHERE b.conversation_id = p_conversation AND b.counter = p_counter AND coalesce(b.task_id, 0) = ANY (scopes);
    INSERT INTO {schema}.budget_reservations AS r
        (conversation_id, task_id, counter, run_token, idempotency_key, amount, actual, closed_at)
    VALUES (p_conversation, p_task, p_counter, p_token, p_key, p_amount,
        CASE WHEN p_spend THEN p_amount END, CASE WHEN p_spend THEN now() END)
    RETURNING r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed;
    outcome := 'reserved';
END
$fn$;

-- budget_record closes reservation p_id of task p_task with what was
-- spent (p_actual): its counter's budgets locked (as every closer of a
-- reservation locks them, so that the reading after the locks stands),
-- the reservation read again, then closed, and p_actual charged to every
-- budget of the counter above the task in place of the amount held.
-- Outcomes: 'recorded'; 'closed' (it was closed before: the row as it
-- stands, for the engine to tell a repeat from a refusal);
-- 'no_reservation' (none of that id is the task's); 'raced' (closed by
-- another meanwhile, which the locks rule out). Nothing is written but on
-- 'recorded'.
CREATE FUNCTION {schema}.budget_record(p_conversation text, p_task bigint, p_id bigint, p_actual bigint,
        OUT outcome text,
        OUT r_id bigint, OUT r_conversation text, OUT r_task bigint, OUT r_counter text, OUT r_token bigint,
        OUT r_key text, OUT r_amount bigint, OUT r_actual bigint, OUT r_lapsed boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    scopes bigint[];
BEGIN
    SELECT r.counter INTO r_counter FROM {schema}.budget_reservations r
    WHERE r.conversation_id = p_conversation AND r.id = p_id AND r.task_id = p_task;
    IF NOT FOUND THEN
        outcome := 'no_reservation';
        RETURN;
    END IF;
    PERFORM FROM (SELECT FROM {schema}.budgets b
        WHERE b.conversation_id = p_conversation AND b.counter = r_counter
        ORDER BY b.counter, coalesce(b.task_id, 0)
        FOR UPDATE) locked;
    SELECT r.id, r.conversation_id, r.task_id, r.counter, r.run_token, r.idempotency_key, r.amount, r.actual, r.lapsed
    INTO r_id, r_conversation, r_task, r_counter, r_token, r_key, r_amount, r_actual, r_lapsed
    FROM {schema}.budget_reservations r WHERE r.conversation_id = p_conversation AND r.id = p_id;
    IF r_actual IS NOT NULL THEN
        outcome := 'closed';
        RETURN;
    END IF;

    WITH RECURSIVE chain (id, owner_task_id) AS (
        SELECT t.id, t.owner_task_id FROM {schema}.tasks t
        WHERE t.conversation_id = p_conversation AND t.id = p_task
        UNION ALL
        SELECT t.id, t.owner_task_id FROM chain c
        JOIN {schema}.tasks t ON t.conversation_id = p_conversation AND t.id = c.owner_task_id)
    SELECT array_agg(c.id) || 0::bigint INTO scopes FROM chain c;

    UPDATE {schema}.budget_reservations r SET actual = p_actual, lapsed = false, closed_at = now()
    WHERE r.conversation_id = p_conversation AND r.id = p_id AND r.actual IS NULL;
    IF NOT FOUND THEN
        -- Closed between the reading and this close: not under the locks
        -- every closer takes, so never, but nothing is charged for it.
        outcome := 'raced';
        RETURN;
    END IF;
    UPDATE {schema}.budgets b
    SET reserved = b.reserved - r_amount, spent = b.spent + p_actual, updated_at = now()
    WHERE b.conversation_id = p_conversation AND b.counter = r_counter AND coalesce(b.task_id, 0) = ANY (scopes);
    r_actual := p_actual;
    outcome := 'recorded';
END
$fn$;

-- A budget's spent and reserved are the sums of its scope's reservations
-- (docs/design.md invariant 10): spent = the closed ones' actual +
-- carried, reserved = the open ones' amount. A reservation's insert or
-- close moves them, and a raise no reservation row explains is a forgery.
-- The rule is checked on the rows, not on arbor's statements: at the
-- commit of a transaction that inserted a budget or changed its spent or
-- reserved (a deferred constraint trigger), the budget's sums must agree
-- with its scope's reservations as the transaction leaves them, whatever
-- statements wrote them and in whichever order (a charge may come before
-- the reservation it charges, or in the same statement). Else the commit
-- fails with AB009. The check reads the budget's current row (a later
-- change of the same row in the transaction is checked by its own event)
-- and sums the reservations of its counter in its scope: the whole
-- conversation's for the conversation's budget, the task's subtree's
-- (walked down by primary key) for a task's. Wall-time
-- budgets keep no sums and are not checked.
CREATE FUNCTION {schema}.budget_sums_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    b {schema}.budgets%ROWTYPE;
    closed bigint;
    open bigint;
BEGIN
    SELECT * INTO b FROM {schema}.budgets g WHERE g.conversation_id = NEW.conversation_id AND g.counter = NEW.counter
        AND coalesce(g.task_id, 0) = coalesce(NEW.task_id, 0);
    IF NOT FOUND OR b.spent <> NEW.spent OR b.reserved <> NEW.reserved THEN
        RETURN NULL;
    END IF;
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
        RAISE EXCEPTION 'arbor: budget % of % (task %): spent % and reserved %, but its scope''s reservations explain spent % and reserved %',
            b.counter, b.conversation_id, coalesce(b.task_id, 0), b.spent, b.reserved, closed + b.carried, open
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;

CREATE CONSTRAINT TRIGGER budget_sums_guard AFTER INSERT ON {schema}.budgets
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.counter <> 'wall_ms')
    EXECUTE FUNCTION {schema}.budget_sums_guard();
CREATE CONSTRAINT TRIGGER budget_sums_guard_update AFTER UPDATE OF spent, reserved ON {schema}.budgets
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.counter <> 'wall_ms' AND (NEW.spent <> OLD.spent OR NEW.reserved <> OLD.reserved))
    EXECUTE FUNCTION {schema}.budget_sums_guard();

-- The same rule from the reservations' side, so that a reservation closed
-- at 0, or inserted open with its run's token, with the budgets left as
-- they were, cannot commit: a transaction that inserts a reservation or
-- changes what it spent (actual) checks, at its commit, every budget of
-- the reservation's counter over its task: the task's own, its owners' up
-- to the root, the conversation's; with the same sums as budget_sums_guard
-- (wall-time budgets keep none). When
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
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.counter <> 'wall_ms')
    EXECUTE FUNCTION {schema}.reservation_sums_guard();
CREATE CONSTRAINT TRIGGER reservation_sums_guard_update AFTER UPDATE OF actual ON {schema}.budget_reservations
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.counter <> 'wall_ms' AND NEW.actual IS DISTINCT FROM OLD.actual)
    EXECUTE FUNCTION {schema}.reservation_sums_guard();

-- A fork's copy waits on exactly the copies of its source's waited
-- children. The task guard (fsm.ForkRules) checks a copy's wait_ids as
-- the copy is inserted, when its children are not inserted yet (the fork
-- inserts a tree owners first, in one statement): it can only refuse ids
-- that are not above the copy's own; an id above it could name a task of
-- another conversation created later. At the commit of a transaction that
-- inserted a copy with a wait (a deferred constraint trigger, so that the
-- copy's children are in), every id it waits on must name a task of the
-- copy's conversation that the copy owns and that is a copy of one of its
-- source's waited tasks, and every such copy must be waited on: the
-- source's wait, less what was not copied. Else the commit fails with
-- AB008 (guardrules.SQLStateFork, ErrInvalidTransition). A primary-key probe per
-- waited id, and one look at the copy's children (tasks_owner_idx).
CREATE FUNCTION {schema}.fork_wait_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    src_waits bigint[];
BEGIN
    SELECT s.wait_ids INTO src_waits FROM {schema}.tasks s WHERE s.id = NEW.forked_from;
    IF EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks c
                                 WHERE c.id = w.id AND c.conversation_id = NEW.conversation_id AND c.owner_task_id = NEW.id
                                   AND c.forked_from = ANY(src_waits)))
       OR EXISTS (SELECT 1 FROM {schema}.tasks c
                  WHERE c.conversation_id = NEW.conversation_id AND c.owner_task_id = NEW.id
                    AND c.forked_from = ANY(src_waits) AND NOT c.id = ANY(NEW.wait_ids)) THEN
        RAISE EXCEPTION 'arbor: task % (a fork''s copy of task %) waits on %: not the copies of its source''s waited children',
            NEW.id, NEW.forked_from, NEW.wait_ids
            USING ERRCODE = 'AB008';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER fork_wait_guard AFTER INSERT ON {schema}.tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.forked_from IS NOT NULL AND NEW.wait_ids IS NOT NULL)
    EXECUTE FUNCTION {schema}.fork_wait_guard();

-- The log's INSERT check: an entry is accepted only as arbor writes it,
-- checked once per INSERT statement over its new rows (a transition
-- table), each looked up by key:
--   - every entry names an existing conversation, and a task (if any) of
--     that conversation, and is not stamped in the future nor before them;
--   - a status entry names its task's status as the statement that wrote
--     the entry left it (every statement that changes a status logs it
--     itself, internal/store/logstatus.go);
--   - a progress entry names a task that is running;
--   - an event entry names, by its id, an event of the conversation with
--     the entry's name (and its task, if the entry names one).
-- A fork's copies of a log (entries of a task that is a fork's copy, or
-- of a conversation the fork made) are accepted only in the fork's own
-- transaction. A refused entry fails its statement with AB009.
--
-- The check runs through EXECUTE, planned for each statement with the
-- tables as they are then: a plan PL/pgSQL kept from a session's first
-- statement, made while the tasks table held a page or two, would read
-- the whole table once per entry once it has grown.
CREATE FUNCTION {schema}.log_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    bad_seq bigint;
    bad_kind text;
BEGIN
    EXECUTE 'SELECT a.seq, a.kind
    FROM added a
    CROSS JOIN LATERAL (SELECT l.xmin FROM {schema}.conversation_log l WHERE l.seq = a.seq OFFSET 0) l
    LEFT JOIN LATERAL (SELECT c.created_at FROM {schema}.conversations c
        WHERE (a.task_id IS NULL OR a.kind = ''event'') AND c.id = a.conversation_id OFFSET 0) c ON true
    LEFT JOIN LATERAL (SELECT t.status, t.forked_from, t.created_at, t.xmin FROM {schema}.tasks t
        WHERE t.id = a.task_id AND t.conversation_id = a.conversation_id OFFSET 0) t ON true
    CROSS JOIN LATERAL (SELECT CASE
        WHEN a.task_id IS NOT NULL THEN t.forked_from IS NOT NULL AND t.xmin = l.xmin
        WHEN c.created_at = now() THEN (SELECT f.xmin FROM {schema}.tasks f
            WHERE f.conversation_id = a.conversation_id AND f.forked_from IS NOT NULL LIMIT 1) = l.xmin
        ELSE false END AS copy) k
    WHERE (c.created_at IS NULL AND (a.task_id IS NULL OR a.kind = ''event''))
       OR a.at > clock_timestamp()
       OR (a.task_id IS NOT NULL AND t.status IS NULL)
       OR (a.kind IN (''status'', ''progress'') AND a.task_id IS NULL)
       OR (a.kind = ''status'' AND a.status IS NULL)
       OR (NOT coalesce(k.copy, false) AND (
              (a.kind = ''status'' AND (t.forked_from IS NOT NULL OR a.status IS DISTINCT FROM t.status OR t.xmin <> l.xmin))
           OR (a.kind = ''progress'' AND (t.forked_from IS NOT NULL OR t.status <> ''running''))
           OR a.at < c.created_at
           OR a.at < t.created_at
           OR (a.kind = ''event'' AND NOT coalesce(
                jsonb_typeof(a.payload) = ''object'' AND a.payload->>''event_id'' ~ ''^[0-9]{1,18}$''
                AND EXISTS (SELECT 1 FROM {schema}.events ev
                    WHERE ev.id = (a.payload->>''event_id'')::bigint AND ev.conversation_id = a.conversation_id
                      AND ev.name IS NOT DISTINCT FROM a.name
                      AND (a.task_id IS NULL OR ev.task_id IS NOT DISTINCT FROM a.task_id)), false))))
    LIMIT 1' INTO bad_seq, bad_kind;
    IF bad_seq IS NOT NULL THEN
        RAISE EXCEPTION 'arbor: log entry % (%) is not one arbor writes: the log records what the tasks and events are, appended by the statements that change them', bad_seq, bad_kind
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NULL;
END
$guard$;

CREATE TRIGGER "Arbor_log_guard_insert" AFTER INSERT ON {schema}.conversation_log
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_guard_insert();
