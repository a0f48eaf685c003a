-- The conversation log's status entries are written by the statements that
-- insert tasks and change their statuses, each in the same statement
-- (internal/store/logstatus.go), no longer by triggers over the statement's
-- transition tables (issue 20): those captured every updated row's old and
-- new images, checkpoints and heartbeats included, and planned a join of
-- them afresh for every statement, which cost a claim or a complete about
-- as much again as the update itself. The entries are the same: one per
-- inserted task and per status change, in the order they were written
-- (an abort's settles leaves first), with the same payload. A status
-- written by hand, outside arbor, is no longer logged: the invariant
-- checker reports it (the newest status entry of a task is its status).
DROP TRIGGER log_task_insert ON {schema}.tasks;
DROP TRIGGER log_task_update ON {schema}.tasks;
DROP FUNCTION {schema}.log_task_insert();
DROP FUNCTION {schema}.log_task_update();
