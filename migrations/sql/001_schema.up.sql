-- arbor's tables. {schema} is replaced by the migrator with the quoted schema name.
-- Every table carries conversation_id, and every query filters by it, so the schema
-- can be distributed by conversation_id (DESIGN §8).

CREATE TABLE {schema}.conversations (
    id               text        PRIMARY KEY CHECK (id <> '' AND octet_length(id) <= 200),
    -- The machine that runs the conversation (DESIGN §3.8); null when free.
    owner            text,
    -- Grows with every take-over; every write a machine makes is fenced by it.
    epoch            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- A fresh fencing token for every start of a task: no two starts share one.
CREATE SEQUENCE {schema}.task_token_seq;

-- The order in which tasks settle. Every settle holds the conversation row lock,
-- so within a conversation this is commit order: "children before parents" can be
-- checked after the fact.
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
    -- The wait of a waiting task (DESIGN §3.4).
    wait_policy        text        CHECK (wait_policy IN ('all_settled', 'fail_fast')),
    wait_ids           bigint[],
    -- The sleep of a sleeping task (DESIGN §3.7): its time, and which sleep it is.
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
    CHECK (owner_task_id IS NULL OR owner_task_id < id),
    -- Owner and child share the conversation: the composite key makes it a fact.
    UNIQUE (conversation_id, id),
    FOREIGN KEY (conversation_id, owner_task_id) REFERENCES {schema}.tasks (conversation_id, id)
);

-- Claiming pending tasks across conversations, oldest first (within one
-- conversation, tasks_conversation_live_idx serves).
CREATE INDEX tasks_pending_idx ON {schema}.tasks (id) WHERE status = 'pending';
-- Live children of an owner (waits, completing, abort, reconcile).
CREATE INDEX tasks_live_children_idx ON {schema}.tasks (owner_task_id)
    WHERE status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
-- A repeated create with the same key returns the existing task.
CREATE UNIQUE INDEX tasks_idempotency_key_idx ON {schema}.tasks (conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- A conversation's live tasks (recovery, the invariant checker, the CLI).
CREATE INDEX tasks_conversation_live_idx ON {schema}.tasks (conversation_id, status)
    WHERE status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');
