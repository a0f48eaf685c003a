-- Budgets (docs/agents.md "Budgets", internal/core/budget.go). A budget
-- row is one counter of one scope: the conversation (task_id NULL) or a
-- task and its subtree. max NULL is a tally: it counts, it never refuses.
-- spent is what the scope's subtree recorded; reserved what its open
-- reservations hold. A reservation (budget_reservations) is open while
-- actual is NULL; it is closed once, by its run's record or, when its run
-- is over first, in full (lapsed). spent = the scope's closed reservations
-- + carried; reserved = its open ones (docs/design.md invariant 10).
CREATE TABLE {schema}.budgets (
    conversation_id text   NOT NULL REFERENCES {schema}.conversations (id),
    task_id         bigint,
    counter         text   NOT NULL CHECK (counter ~ '^[a-z][a-z0-9_.]{0,62}$'),
    max             bigint CHECK (max >= 0),
    spent           bigint NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved        bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    -- The part of spent whose reservations were pruned with their tasks.
    carried         bigint NOT NULL DEFAULT 0 CHECK (carried >= 0),
    on_exhausted    text   NOT NULL DEFAULT 'fail' CHECK (on_exhausted IN ('fail', 'park', 'return')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id)
);
CREATE UNIQUE INDEX budgets_scope_idx ON {schema}.budgets (conversation_id, counter, (coalesce(task_id, 0)));
CREATE INDEX budgets_wall_idx ON {schema}.budgets (conversation_id) WHERE counter = 'wall_ms' AND max IS NOT NULL;

CREATE TABLE {schema}.budget_reservations (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id text   NOT NULL,
    task_id         bigint NOT NULL,
    counter         text   NOT NULL,
    -- The run that reserved: the task's token then.
    run_token       bigint NOT NULL,
    idempotency_key text   NOT NULL CHECK (octet_length(idempotency_key) <= 200),
    amount          bigint NOT NULL CHECK (amount >= 0),
    actual          bigint CHECK (actual >= 0),
    lapsed          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    closed_at       timestamptz,
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id),
    CHECK ((actual IS NULL) = (closed_at IS NULL)),
    CHECK (NOT lapsed OR actual = amount)
);
CREATE UNIQUE INDEX budget_reservations_key_idx ON {schema}.budget_reservations (conversation_id, task_id, idempotency_key);
CREATE INDEX budget_reservations_open_idx ON {schema}.budget_reservations (conversation_id, counter) WHERE actual IS NULL;
