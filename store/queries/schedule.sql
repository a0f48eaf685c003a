-- The statements internal/store/schedule.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- Schedules (docs/design.md §3.16): their rows, and the firer's lock and
-- advance of the due ones. The table is not distributed (a handful of rows,
-- by name); the turns a firing creates go through the create's own
-- statements. Every statement reads a schedule's columns in the order of
-- internal/store's scanSchedule; every is read and written in microseconds.


-- UpsertSchedule creates schedule $1, or replaces its definition: its
-- tenant, kind, input, conversation, cron, time zone, every (µs) and missed
-- policy. A new one's next tick is $10; a replaced one keeps its next tick,
-- its pause and its last firing, unless its timing (cron, time zone,
-- every) changed, when its next tick is $10.
--
-- Locks: row locks on what it writes (inserts into or updates schedules),
-- held until the transaction ends.
-- name: UpsertSchedule
INSERT INTO {schema}.schedules AS s (name, tenant, kind, input, conversation_id, cron, time_zone, every, missed, next_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::bigint * interval '1 microsecond', $9, $10)
ON CONFLICT (name) DO UPDATE SET
    tenant = EXCLUDED.tenant, kind = EXCLUDED.kind, input = EXCLUDED.input,
    conversation_id = EXCLUDED.conversation_id, cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone,
    every = EXCLUDED.every, missed = EXCLUDED.missed,
    next_at = CASE WHEN (s.cron, s.time_zone, s.every) IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.every)
        THEN s.next_at ELSE EXCLUDED.next_at END,
    updated_at = now()
RETURNING s.name, s.tenant, s.kind, s.input, s.conversation_id, s.cron, s.time_zone,
    (extract(epoch FROM s.every) * 1000000)::bigint, s.missed, s.paused, s.next_at,
    s.last_tick_at, s.last_task_id, s.last_error, s.created_at, s.updated_at;

-- Schedules lists every schedule by name.
--
-- Locks: none (a read).
-- name: Schedules
SELECT name, tenant, kind, input, conversation_id, cron, time_zone,
    (extract(epoch FROM every) * 1000000)::bigint, missed, paused, next_at,
    last_tick_at, last_task_id, last_error, created_at, updated_at
FROM {schema}.schedules ORDER BY name;

-- LockSchedule reads schedule $1 and locks it.
--
-- Locks: FOR UPDATE on the schedule's row, held until the transaction ends.
-- name: LockSchedule
SELECT name, tenant, kind, input, conversation_id, cron, time_zone,
    (extract(epoch FROM every) * 1000000)::bigint, missed, paused, next_at,
    last_tick_at, last_task_id, last_error, created_at, updated_at
FROM {schema}.schedules WHERE name = $1 FOR UPDATE;

-- SetSchedulePaused pauses schedule $1 ($2 true) or resumes it with its
-- next tick at $3 ($2 false).
--
-- Locks: row locks on what it writes (updates schedules), held until the
-- transaction ends.
-- name: SetSchedulePaused
UPDATE {schema}.schedules SET paused = $2, next_at = coalesce($3, next_at), updated_at = now()
WHERE name = $1
RETURNING name, tenant, kind, input, conversation_id, cron, time_zone,
    (extract(epoch FROM every) * 1000000)::bigint, missed, paused, next_at,
    last_tick_at, last_task_id, last_error, created_at, updated_at;

-- DeleteSchedule deletes schedule $1.
--
-- Locks: row locks on what it writes (deletes from schedules), held until
-- the transaction ends.
-- name: DeleteSchedule
DELETE FROM {schema}.schedules WHERE name = $1;

-- AnyScheduleDue says whether a schedule is due by the database's clock:
-- the firer's look at each poll, one probe of the due index, before it
-- opens a transaction to fire.
--
-- Locks: none (a read).
-- name: AnyScheduleDue
SELECT EXISTS (SELECT 1 FROM {schema}.schedules WHERE next_at <= now() AND NOT paused);

-- DueSchedules locks at most $1 schedules that are due by the
-- transaction's clock (next_at <= now(), not paused), soonest first,
-- skipping those another transaction holds (another node firing them, or
-- a change to them), with that clock.
--
-- Locks: FOR UPDATE on the rows it selects, skipping rows another
-- transaction holds, held until the transaction ends.
-- name: DueSchedules
SELECT name, tenant, kind, input, conversation_id, cron, time_zone,
    (extract(epoch FROM every) * 1000000)::bigint, missed, paused, next_at,
    last_tick_at, last_task_id, last_error, created_at, updated_at, now()
FROM {schema}.schedules
WHERE next_at <= now() AND NOT paused
ORDER BY next_at, name LIMIT $1
FOR UPDATE SKIP LOCKED;

-- AdvanceSchedule records a firing of schedule $1: its next tick $2, and,
-- when it fired a tick, that tick $3 and the turn $4 it created, or the
-- error $5 that kept it from creating one (NULL: none); or, with no tick,
-- the error $5 that keeps it from firing at all. A firing that fired no
-- tick and had no error (a skip of late ticks only) keeps the last error.
--
-- Locks: row locks on what it writes (updates schedules), held until the
-- transaction ends.
-- name: AdvanceSchedule
UPDATE {schema}.schedules
SET next_at = $2, last_tick_at = coalesce($3, last_tick_at), last_task_id = CASE WHEN $3::timestamptz IS NULL THEN last_task_id ELSE $4 END,
    last_error = CASE WHEN $3::timestamptz IS NULL AND $5::text IS NULL THEN last_error ELSE $5 END, updated_at = now()
WHERE name = $1;
