-- Schedules (issue 40; docs/design.md §3.16): a turn started at cron times
-- or every interval, exactly once per tick across every node.

-- One row per schedule, by the name its user gives it. Exactly one of
-- cron (a five-field expression, read in time_zone) and every is set.
-- conversation_id NULL starts each tick's turn in a new conversation
-- ("<name>@<tick>"); else every turn goes to that one. next_at is the
-- next tick: a firer locks the due rows (next_at <= now(), not paused,
-- FOR UPDATE SKIP LOCKED), creates their turns and moves next_at past
-- now() in one transaction, so a tick is fired once whatever the number
-- of nodes. missed says what a firer does with ticks it comes to late
-- (more than its grace after them): drops them (skip) or runs one turn
-- for them all (run_once). last_tick_at, last_task_id and last_error tell
-- what the last firing did.
CREATE TABLE {schema}.schedules (
    name            text        PRIMARY KEY CHECK (name <> '' AND octet_length(name) <= 150),
    tenant          text        NOT NULL DEFAULT '' CHECK (octet_length(tenant) <= 200),
    kind            text        NOT NULL CHECK (kind <> '' AND octet_length(kind) <= 200),
    input           jsonb,
    conversation_id text        CHECK (conversation_id <> '' AND octet_length(conversation_id) <= 200),
    cron            text        CHECK (cron <> '' AND octet_length(cron) <= 200),
    time_zone       text        NOT NULL DEFAULT 'UTC' CHECK (time_zone <> '' AND octet_length(time_zone) <= 100),
    every           interval    CHECK (every >= interval '1 second'),
    missed          text        NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'run_once')),
    paused          boolean     NOT NULL DEFAULT false,
    next_at         timestamptz NOT NULL,
    last_tick_at    timestamptz,
    last_task_id    bigint,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every IS NULL))
);

-- The firer's index: the schedules due first.
CREATE INDEX schedules_due_idx ON {schema}.schedules (next_at) WHERE NOT paused;
