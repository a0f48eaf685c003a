-- Events, awaits, deadlines and the conversation log (issue 13; docs/agents.md).
--
-- A task awaiting an event is sleeping with await_name set (and, with a
-- timeout, wake_at and its River wake job, as a sleep has); await_token is
-- the token a client posts back to answer exactly that await. delivered is
-- what woke it: the event ({"event_id", "name", "payload", ...}) or the
-- timeout ({"name", "timed_out": true}). deadline, fixed at create, is when
-- a task still live fails with code deadline_exceeded.
ALTER TABLE {schema}.tasks
    ADD COLUMN await_name text CHECK (await_name <> '' AND octet_length(await_name) <= 200),
    ADD COLUMN await_token text,
    ADD COLUMN delivered jsonb,
    ADD COLUMN deadline timestamptz;
CREATE UNIQUE INDEX tasks_await_token_idx ON {schema}.tasks (await_token) WHERE await_token IS NOT NULL;
CREATE INDEX tasks_awaiting_idx ON {schema}.tasks (conversation_id, await_name, id)
    WHERE status = 'sleeping' AND await_name IS NOT NULL;
CREATE INDEX tasks_deadline_idx ON {schema}.tasks (deadline)
    WHERE deadline IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'sleeping', 'completing');

-- Events emitted to a conversation, or to one of its tasks. queued: every
-- emit is delivered to one await, in order; not queued: the first emit of a
-- name (per conversation and address) wins and later ones are the same
-- emit. delivered_to is the task the event woke.
CREATE TABLE {schema}.events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id text NOT NULL REFERENCES {schema}.conversations (id),
    task_id         bigint,
    name            text NOT NULL CHECK (name <> '' AND octet_length(name) <= 200),
    payload         jsonb,
    idempotency_key text CHECK (octet_length(idempotency_key) <= 200),
    queued          boolean NOT NULL,
    emitted_at      timestamptz NOT NULL DEFAULT now(),
    delivered_to    bigint,
    delivered_at    timestamptz,
    FOREIGN KEY (conversation_id, task_id) REFERENCES {schema}.tasks (conversation_id, id),
    FOREIGN KEY (conversation_id, delivered_to) REFERENCES {schema}.tasks (conversation_id, id),
    CHECK ((delivered_to IS NULL) = (delivered_at IS NULL))
);
CREATE UNIQUE INDEX events_key_idx ON {schema}.events (conversation_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_undelivered_idx ON {schema}.events (conversation_id, name, id) WHERE delivered_to IS NULL;
CREATE INDEX events_first_idx ON {schema}.events (conversation_id, name, (coalesce(task_id, 0))) WHERE NOT queued;

-- The conversation log: every status change of every task, the handlers'
-- progress and the events, in the order they committed within a
-- conversation (every writer of a conversation's log holds its row
-- exclusively, so seq grows with commit order per conversation).
CREATE SEQUENCE {schema}.log_seq;
CREATE TABLE {schema}.conversation_log (
    seq             bigint PRIMARY KEY DEFAULT nextval('{schema}.log_seq'),
    conversation_id text NOT NULL,
    task_id         bigint,
    kind            text NOT NULL CHECK (kind IN ('status', 'progress', 'event')),
    status          text,
    name            text,
    payload         jsonb,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX conversation_log_conversation_idx ON {schema}.conversation_log (conversation_id, seq);

-- Status entries, one statement per statement: a batch of a thousand
-- changes is one insert of a thousand rows. Settles are logged in the
-- order they settled (an abort's leaves first).
CREATE FUNCTION {schema}.log_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           CASE WHEN n.owner_task_id IS NOT NULL THEN jsonb_build_object('owner', n.owner_task_id) END
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER log_task_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_task_insert();

CREATE FUNCTION {schema}.log_task_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT n.conversation_id, n.id, 'status', n.status, n.kind,
           nullif(jsonb_strip_nulls(jsonb_build_object(
               'owner', n.owner_task_id,
               'error', CASE WHEN n.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN n.error->>'code' END,
               'await', CASE WHEN n.status = 'sleeping' THEN n.await_name END)), '{}'::jsonb)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.status <> n.status
    ORDER BY n.settle_seq NULLS FIRST, n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER log_task_update AFTER UPDATE ON {schema}.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_task_update();
