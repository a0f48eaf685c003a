DROP INDEX {schema}.tasks_sleeping_wake_idx;
ALTER TABLE {schema}.tasks
    DROP COLUMN error_history,
    DROP COLUMN retry_backoff_cap,
    DROP COLUMN retry_backoff_base,
    DROP COLUMN wake_job_id;
