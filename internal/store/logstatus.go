package store

// The conversation log's status entries are written by the statements that
// change the tasks, in the same statement (issue 20): each statement that
// inserts a task or changes a status is a data-modifying CTE, w, that
// returns the rows it wrote whole, a second CTE that appends their entries,
// and the statement's own result read from w. Until migration 024 two
// triggers wrote them, over the statement's transition tables: every
// update of a task (a checkpoint, a heartbeat, none of which is logged)
// captured its rows' old and new images twice and planned a join of them
// afresh (EXECUTE, since a cached plan was sized by its first statement),
// and a claim or a complete cost about twice the update itself.
//
// Every statement of this package that writes tasks.status or inserts a
// task is built with logged (TestEveryStatusWriteIsLogged keeps it so), and
// the invariant checker reports a task whose newest status entry is not
// its status: a hand-written change, which no trigger logs any more, is
// found there.

// logStatus appends one status entry per row of w, a CTE of task rows: an
// abort's settles in the order they settled (leaves first), every other
// row by id. Its payload names the owner, the error's code and message of
// a failed, aborted, cancelled or orphaned task, and what a sleeping task
// awaits (the payload the triggers wrote, so that readers of the log see
// no change).
const logStatus = `INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
		SELECT w.conversation_id, w.id, 'status', w.status, w.kind,
		       nullif(jsonb_strip_nulls(jsonb_build_object(
		           'owner', w.owner_task_id,
		           'error', CASE WHEN w.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN w.error->>'code' END,
		           'message', CASE WHEN w.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN nullif(w.error->>'message', '') END,
		           'await', CASE WHEN w.status = 'sleeping' THEN w.await_name END)), '{}'::jsonb)
		FROM w ORDER BY w.settle_seq NULLS FIRST, w.id`

// logged makes write, an INSERT or UPDATE of the tasks table whose target
// is named alias (and which has no RETURNING of its own), a statement that
// also logs the status of every row it writes, and returns result (a
// select list over the written rows' columns, unqualified) followed by
// tail (ORDER BY, or ""). Every row such a write returns changed its
// status or is new: the state machine has no edge from a status to itself
// but the checkpoint's, which is not logged and not written so.
func logged(write, alias, result, tail string) string {
	return `WITH w AS (` + write + `
		RETURNING ` + alias + `.*),
	logged AS (` + logStatus + `)
	SELECT ` + result + ` FROM w ` + tail
}
