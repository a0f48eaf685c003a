-- Sleep, wake and retries (DESIGN §3.5, §3.7).

-- The River job that wakes the task from its current (or last) sleep: the
-- engine removes it in the same transaction as an early wake, a cancel or an
-- abort, so that no stale job is left behind. It may point to a job River
-- has since cleaned up; only the job of a sleeping task is guaranteed live.
ALTER TABLE {schema}.tasks ADD COLUMN wake_job_id bigint;

-- The task's retry policy besides max_retries: exponential backoff from
-- retry_backoff_base, doubling per retry, capped at retry_backoff_cap, with
-- jitter. Stored per task, resolved at create from the engine's defaults, so
-- a retry computed on any node follows the policy the task was created with.
ALTER TABLE {schema}.tasks
    ADD COLUMN retry_backoff_base interval NOT NULL DEFAULT '1 second'
        CHECK (retry_backoff_base >= interval '0'),
    ADD COLUMN retry_backoff_cap  interval NOT NULL DEFAULT '5 minutes'
        CHECK (retry_backoff_cap >= retry_backoff_base);

-- One entry per failed run ({try, at, code, message, non_retryable}), oldest
-- first, bounded by the engine (the newest entries are kept).
ALTER TABLE {schema}.tasks ADD COLUMN error_history jsonb NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(error_history) = 'array');

-- Sleeps due soon, across conversations: what a waker arms its timers from.
CREATE INDEX tasks_sleeping_wake_idx ON {schema}.tasks (wake_at) WHERE status = 'sleeping';
