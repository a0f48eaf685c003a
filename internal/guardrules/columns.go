package guardrules

import (
	"slices"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/internal/sqllit"
)

// The column guard. A status change is only half of a task's history: which
// columns change with it matters as much (a token changing outside a start
// is a take-over outside the engine; attempt moving by anything but one is a
// forged recovery). ColumnRules says, for every column of the tasks table,
// on which status changes (from, to) it may take a new value, and what the
// new value must then be; the database trigger generated from it (fsmgen.GuardSQL)
// refuses every other change, so a bug or a hand-written UPDATE cannot make
// a history the engine would not have made.
//
// The trigger sees statuses, not events: where two events share a status
// change (sleep and retry both go running → sleeping) a column may change on
// it if either event changes it, and the value rules say how.

// ColumnRule says when one column of the tasks table may change.
type ColumnRule struct {
	Column string
	// Changes are the status changes on which the column may take a new
	// value; empty for a column that never changes.
	Changes [][2]arbortype.Status
	// Value, when not empty, is an SQL condition (over OLD and NEW) the row
	// must meet whenever the column changed.
	Value string
	// Why says why, for the generated code and the docs.
	Why string
}

// on returns the status changes of the events' edges.
func on(events ...fsm.Event) [][2]arbortype.Status {
	var out [][2]arbortype.Status
	for _, e := range fsm.Edges() {
		p := [2]arbortype.Status{e.From, e.To}
		if slices.Contains(events, e.Event) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// from keeps the changes that start in s.
func from(s arbortype.Status, changes [][2]arbortype.Status) [][2]arbortype.Status {
	var out [][2]arbortype.Status
	for _, c := range changes {
		if c[0] == s {
			out = append(out, c)
		}
	}
	return out
}

// leaving returns every status change out of s to another status.
func leaving(s arbortype.Status) [][2]arbortype.Status {
	var out [][2]arbortype.Status
	for _, p := range fsm.StatusChanges() {
		if p[0] == s {
			out = append(out, p)
		}
	}
	return out
}

// settling returns every status change into a settled status.
func settling() [][2]arbortype.Status {
	var out [][2]arbortype.Status
	for _, p := range fsm.StatusChanges() {
		if p[1].Settled() {
			out = append(out, p)
		}
	}
	return out
}

func union(sets ...[][2]arbortype.Status) [][2]arbortype.Status {
	var out [][2]arbortype.Status
	for _, s := range sets {
		for _, p := range s {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// ColumnRules lists every column of the tasks table with the changes it may
// come with, in table order. A column missing here is refused by the
// generator (TestColumnRulesCoverTheTable checks the list against the
// table).
func ColumnRules() []ColumnRule {
	immutable := func(col, why string) ColumnRule { return ColumnRule{Column: col, Why: why} }
	run := union(on(fsm.Start), leaving(arbortype.StatusRunning))
	return []ColumnRule{
		immutable("id", "identity"),
		immutable("conversation_id", "identity: a task never moves"),
		immutable("owner_task_id", "identity: the ownership graph is fixed at create"),
		immutable("kind", "identity: the handler a task was created for"),
		{Column: "status", Changes: fsm.StatusChanges(), Why: "the transition table (checked first)"},
		immutable("background", "fixed at create"),
		immutable("input", "fixed at create"),
		{Column: "phase", Changes: union(on(fsm.Checkpoint), on(fsm.Wait), on(fsm.Sleep)), Why: "a checkpoint, or the phase a wait or a sleep saves"},
		{Column: "state", Changes: union(on(fsm.Checkpoint), on(fsm.Wait), on(fsm.Sleep)), Why: "a checkpoint, or the state a wait or a sleep saves"},
		{Column: "result", Changes: union(on(fsm.Hold), from(arbortype.StatusRunning, on(fsm.Complete)), on(fsm.Cancel)),
			Why: "a completion (held while completing, kept when it completes) or a cancel"},
		{Column: "error", Changes: union(on(fsm.Retry), on(fsm.Fail, fsm.Expire), on(fsm.Cancel), on(fsm.Abort, fsm.Orphan)), Why: "a failure, retried or final, an abandon's code, or an abort's reason"},
		{Column: "attempt", Changes: on(fsm.Recover), Value: "NEW.attempt = OLD.attempt + 1",
			Why: "one more per counted recovery (its holder died or lost its lease), and only then"},
		immutable("restart_limit", "fixed at create"),
		immutable("abandon_on_restart", "fixed at create"),
		{Column: "abort_requested", Changes: on(fsm.Abort, fsm.Orphan), Value: "NEW.abort_requested",
			Why: "set by an abort, as it settles the task"},
		{Column: "wait_policy", Changes: on(fsm.Wait), Why: "a wait; kept after it for the resumed handler"},
		{Column: "wait_ids", Changes: union(on(fsm.Wait), on(fsm.Rerun)), Value: "change <> 'waiting>waiting' OR " + rerunInWait,
			Why: "a wait, kept after it for the resumed handler; while it waits, a waited task's rerun takes its place"},
		{Column: "wake_at", Changes: union(on(fsm.Sleep, fsm.Retry, fsm.Await), on(fsm.Wake)), Value: "NEW.wake_at IS NOT NULL OR NEW.await_name IS NOT NULL OR NEW.status = 'pending'",
			Why: "a sleep or a retry's backoff, or an await's timeout (none for an await without one); an event delivered before the timeout clears it"},
		{Column: "sleep_seq", Changes: on(fsm.Sleep, fsm.Retry, fsm.Await), Value: "NEW.sleep_seq = OLD.sleep_seq + 1", Why: "one more per sleep or await"},
		immutable("max_retries", "fixed at create"),
		{Column: "retries", Changes: on(fsm.Retry), Value: "NEW.retries = OLD.retries + 1", Why: "one more per retry"},
		immutable("retry_backoff_base", "fixed at create"),
		immutable("retry_backoff_cap", "fixed at create"),
		{Column: "error_history", Changes: union(on(fsm.Retry), on(fsm.Fail, fsm.Expire)), Why: "appended to by a failure"},
		{Column: "wake_job_id", Changes: union(on(fsm.Sleep, fsm.Retry, fsm.Await), on(fsm.Wake)), Why: "the River job of a new sleep or await timeout; dropped with an event delivered before it"},
		{Column: "token", Changes: run, Why: "a fresh token when a run starts, none when it ends"},
		{Column: "run_epoch", Changes: run, Why: "the lease epoch a run starts under, none when it ends"},
		{Column: "lease_expires_at", Changes: union(run, on(fsm.Checkpoint)), Why: "a run's task lease, extended by a checkpoint or heartbeat"},
		immutable("idempotency_key", "fixed at create"),
		{Column: "settle_seq", Changes: settling(), Why: "numbered when the task settles"},
		immutable("created_at", "fixed at create"),
		{Column: "updated_at", Changes: nil, Why: "free: any write stamps it"},
		{Column: "started_at", Changes: on(fsm.Start), Value: "OLD.started_at IS NULL", Why: "the first start, and only it"},
		{Column: "settled_at", Changes: settling(), Why: "stamped when the task settles"},
		{Column: "await_name", Changes: on(fsm.Sleep, fsm.Retry, fsm.Await), Why: "set by an await, cleared by a plain sleep (kept after the wake, for the resumed handler)"},
		{Column: "await_token", Changes: on(fsm.Sleep, fsm.Retry, fsm.Await), Why: "a fresh token with every await, none with a plain sleep"},
		{Column: "delivered", Changes: union(on(fsm.Sleep, fsm.Retry, fsm.Await), from(arbortype.StatusSleeping, on(fsm.Wake))), Value: deliveredRule,
			Why: "what woke an await (the event, or its timeout), cleared when the task parks again: an event delivered to this task, carried as it was emitted, or a timeout with no event"},
		immutable("deadline", "fixed at create"),
		immutable("forked_from", "fixed at insert: the task a fork copied"),
		immutable("rerun_of", "fixed at insert: the task a rerun runs again"),
		immutable("trace", "the trace context the task was created in, fixed at create"),
		immutable("tenant", "its conversation's tenant, which never changes"),
		immutable("priority", "fixed at create"),
		immutable("queue_at", "fixed at create: created_at less the priority's aging"),
		immutable("queue_expires_at", "a queued turn's time to live, fixed at create"),
		immutable("concurrency_key", "fixed at create"),
		{Column: "slots", Changes: union(run, on(fsm.Checkpoint)), Value: "change <> 'running>running' OR NEW.slots @> coalesce(OLD.slots, '{}')",
			Why: "the concurrency limits a run holds a slot of: taken as it starts, given back as it ends (task_slots), or named by a limit set while it runs"},
	}
}

// deliveredRule is what an await's wake may say woke it: nothing (the
// column cleared), a timeout that names no event and carries no payload,
// or an event of the task's conversation that was delivered to this very
// task (events.delivered_to, written before the wake in the same
// transaction), with its payload as emitted. So an approval no emit made
// is refused: a payload that is not its event's, an event never delivered
// to the task, of another name or address (the event's own guard,
// RecordRules), or a fork's copy (a copy is delivered only to a copy).
// What is not refused, and cannot be: an emit written by hand exactly as
// Emit writes it (the event inserted undelivered and stamped now, its
// delivery to the awaiting task, the wake). The guards check what the rows
// say, not which program wrote them, and a role with DML on the events and
// tasks may emit as Engine.Emit does for it; who may approve is a matter
// of grants (docs/operations.md, "Roles").
const deliveredRule = `NEW.delivered IS NULL
            OR (coalesce(NEW.delivered->>'timed_out', '') = 'true' AND NOT (NEW.delivered ? 'event_id') AND NOT (NEW.delivered ? 'payload'))
            OR CASE WHEN NEW.delivered->>'event_id' ~ '^[0-9]{1,18}$' THEN EXISTS (SELECT 1 FROM {schema}.events ev
                WHERE ev.conversation_id = NEW.conversation_id AND ev.id = (NEW.delivered->>'event_id')::bigint
                  AND ev.delivered_to = NEW.id AND ev.payload IS NOT DISTINCT FROM NEW.delivered->'payload') ELSE false END`

// FreeColumns may change with any write.
var FreeColumns = []string{"updated_at"}

// IdentityColumns never change: the guard checks them first (identity
// rule, AB003), before the column rules.
var IdentityColumns = []string{"id", "conversation_id", "owner_task_id", "kind", "background"}

// RowRules are conditions every row of the tasks table meets after any
// update, whatever changed: the run columns exactly while running, the
// settle columns exactly when settled, and the changes some status changes
// must make (a sleep numbers itself). They are what makes "a run ends,
// its token goes" and "a settled task is numbered" facts of the table.
func RowRules() []ColumnRule {
	settled := sqllit.Quoted(sqllit.Settled())
	return []ColumnRule{
		{Column: "token", Value: "(NEW.status = 'running') = (NEW.token IS NOT NULL)", Why: "a token exactly while running"},
		{Column: "run_epoch", Value: "(NEW.status = 'running') = (NEW.run_epoch IS NOT NULL)", Why: "a run epoch exactly while running"},
		{Column: "lease_expires_at", Value: "(NEW.status = 'running') = (NEW.lease_expires_at IS NOT NULL)", Why: "a task lease exactly while running"},
		{Column: "settle_seq", Value: "(NEW.status IN (" + settled + ")) = (NEW.settle_seq IS NOT NULL)", Why: "a settle number exactly when settled"},
		{Column: "settled_at", Value: "(NEW.status IN (" + settled + ")) = (NEW.settled_at IS NOT NULL)", Why: "a settle time exactly when settled"},
		{Column: "abort_requested", Value: "NOT NEW.abort_requested OR NEW.status IN ('aborted', 'orphaned')", Why: "only an abort marks a task, as it settles it"},
		{Column: "sleep_seq", Value: "change <> 'running>sleeping' OR NEW.sleep_seq = OLD.sleep_seq + 1", Why: "every sleep has a number of its own"},
		{Column: "token", Value: "change <> 'pending>running' OR NEW.token IS DISTINCT FROM OLD.token", Why: "every start has a token of its own"},
		{Column: "slots", Value: "NEW.status = 'running' OR NEW.slots IS NULL", Why: "slots are held only while running"},
	}
}

// InsertRules are the columns a new row must have as the engine creates it:
// never run, no history; pending, or running — started by its create
// (docs/design.md §3.18), with a token, its conversation's epoch, a live
// task lease and started now (InsertChecks says under whom).
func InsertRules() []string {
	return []string{
		"NEW.status IN ('pending', 'running')",
		"(NEW.status = 'running') = (NEW.token IS NOT NULL)",
		"(NEW.status = 'running') = (NEW.run_epoch IS NOT NULL)",
		"(NEW.status = 'running') = coalesce(NEW.lease_expires_at > now(), false)",
		"(NEW.status = 'pending') = (NEW.lease_expires_at IS NULL)",
		"(NEW.status = 'running') = coalesce(NEW.started_at = now(), false)",
		"(NEW.status = 'pending') = (NEW.started_at IS NULL)",
		"NEW.settled_at IS NULL", "NEW.settle_seq IS NULL",
		"NEW.attempt = 0", "NEW.retries = 0", "NEW.sleep_seq = 0",
		"NOT NEW.abort_requested",
		// A rerun carries its source's checkpoint (InsertChecks).
		"(NEW.rerun_of IS NOT NULL OR (NEW.phase = '' AND NEW.state IS NULL))",
		"NEW.result IS NULL", "NEW.error IS NULL", "NEW.error_history = '[]'::jsonb",
		"NEW.wait_policy IS NULL", "NEW.wait_ids IS NULL", "NEW.wake_at IS NULL", "NEW.wake_job_id IS NULL",
		"NEW.await_name IS NULL", "NEW.await_token IS NULL", "NEW.delivered IS NULL",
		"NEW.slots IS NULL",
		// Stamped by the database, not by the writer.
		"NEW.created_at = now()",
		// Queued at its creation less its priority's aging (docs/design.md §3.15).
		"NEW.queue_at = NEW.created_at - NEW.priority * interval '1 second'",
	}
}

// InsertCheck is a rule of a fresh row that reads another row: checked
// apart from InsertRules, only When it applies, so that the check every
// insert makes stays an expression PL/pgSQL evaluates without the executor.
type InsertCheck struct {
	When, Check string
}

// InsertChecks are the rules of a fresh row that read other rows.
func InsertChecks() []InsertCheck {
	return []InsertCheck{
		// A child only of an owner that can still take one (docs/design.md
		// §3.1): not settled, completing or being aborted.
		{When: "NEW.owner_task_id IS NOT NULL", Check: "EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id" +
			" AND o.status IN ('pending', 'running', 'waiting', 'sleeping') AND NOT o.abort_requested)"},
		// A task started by its create (docs/design.md §3.18): a root, the
		// first task of its conversation, which a live holder took at the
		// run's epoch, with no concurrency limit that could count it.
		{When: "NEW.status = 'running'", Check: "NEW.owner_task_id IS NULL AND NEW.concurrency_key IS NULL AND NEW.rerun_of IS NULL" +
			" AND EXISTS (SELECT 1 FROM {schema}.conversations c JOIN {schema}.holders h ON h.id = c.holder_id" +
			" WHERE c.id = NEW.conversation_id AND c.epoch = NEW.run_epoch AND h.expires_at > now() AND h.ended_by IS NULL)" +
			" AND NOT EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.conversation_id = NEW.conversation_id)" +
			" AND NOT EXISTS (SELECT 1 FROM {schema}.concurrency_limits l WHERE l.key IN ('tenant:' || NEW.tenant, 'kind:' || NEW.kind))"},
		// A rerun (docs/design.md §3.17) runs again a failed, aborted or
		// cancelled task of its conversation, under the same owner, of the
		// same kind and input, from its checkpoint; made after it.
		{When: "NEW.rerun_of IS NOT NULL", Check: "EXISTS (SELECT 1 FROM {schema}.tasks rs WHERE rs.id = NEW.rerun_of" +
			" AND rs.id < NEW.id AND rs.conversation_id = NEW.conversation_id" +
			" AND rs.owner_task_id IS NOT DISTINCT FROM NEW.owner_task_id AND rs.kind = NEW.kind" +
			" AND rs.status IN ('failed', 'aborted', 'cancelled') AND rs.input IS NOT DISTINCT FROM NEW.input" +
			" AND rs.phase = NEW.phase AND rs.state IS NOT DISTINCT FROM NEW.state)"},
	}
}

// rerunInWait is the one change of a waiting task's wait_ids (event rerun):
// a task it waits on replaced by that task's rerun, a child of the same
// owner (the rerun is inserted first, in the same transaction).
const rerunInWait = `EXISTS (SELECT 1 FROM {schema}.tasks r WHERE r.rerun_of = ANY(OLD.wait_ids) AND r.owner_task_id = OLD.id
                AND NEW.wait_ids = array_replace(OLD.wait_ids, r.rerun_of, r.id))`

// ForkCopied are the columns a forked row (forked_from set) carries over
// from its source verbatim: its whole settled history, times included. A
// fork may insert a settled row only so (docs/design.md §3.10).
func ForkCopied() []string {
	return []string{
		"kind", "status", "background", "input", "phase", "state", "result", "error",
		"attempt", "restart_limit", "abandon_on_restart", "abort_requested", "wait_policy",
		"wake_at", "sleep_seq", "max_retries", "retries", "retry_backoff_base", "retry_backoff_cap",
		"error_history", "idempotency_key", "created_at", "started_at", "settled_at",
		"await_name", "deadline", "trace",
		"tenant", "priority", "queue_at", "queue_expires_at", "concurrency_key",
	}
}

// ForkRules are the conditions a forked row meets besides ForkCopied, over
// NEW and src (its source row): the copy lives in another conversation that
// has nothing live, its owner is the copy of its source's owner, it holds
// no run, no wake job and no await token of its own, and it is numbered as
// it settled. wait_ids (remapped to the copies) and the event id in
// delivered (remapped to the copied event) are the only values that differ.
func ForkRules() []string {
	settled := sqllit.Quoted(sqllit.Settled())
	return []string{
		"src.status IN (" + settled + ")",
		"NEW.conversation_id <> src.conversation_id",
		nothingLive("NEW"),
		"(NEW.owner_task_id IS NULL) = (src.owner_task_id IS NULL)",
		"(NEW.owner_task_id IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks o WHERE o.id = NEW.owner_task_id AND o.forked_from = src.owner_task_id))",
		"NEW.token IS NULL", "NEW.run_epoch IS NULL", "NEW.lease_expires_at IS NULL",
		"NEW.wake_job_id IS NULL", "NEW.await_token IS NULL", "NEW.settle_seq IS NOT NULL", "NEW.settle_seq > 0",
		// The copy's waited children are copies too, made after it (ids
		// grow from owner to child): never a task that existed before.
		// A waited background child still live is not copied (a fork
		// copies settled tasks), so the copy may wait on fewer. That they
		// are exactly the copies of its source's waited children is
		// checked at the commit, once they are in (the baseline's
		// fork_wait_guard).
		"(NEW.wait_ids IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id) WHERE w.id <= NEW.id))",
		"(NEW.wait_ids IS NULL) = (src.wait_ids IS NULL)",
		"coalesce(cardinality(NEW.wait_ids), 0) <= coalesce(cardinality(src.wait_ids), 0)",
		"(NEW.delivered - 'event_id') IS NOT DISTINCT FROM (src.delivered - 'event_id')",
		// A copy does not carry a rerun's link (docs/design.md §3.17).
		"NEW.rerun_of IS NULL",
	}
}

// nothingLive is the rule "conversation row.conversation_id has no live
// task", checked once per row a fork inserts or the prune deletes. The
// guard's statements are planned once per session for any conversation (a
// generic plan), and a plain NOT EXISTS then is a sequential scan expected
// to stop at its first match: beside 200,000 live tasks of another
// conversation, a fork of 501 tasks read 10^8 rows (5.4 s). The first
// live task in the order of tasks_conversation_live_idx, LIMIT 1, is an
// index probe whatever the estimates (a sequential scan would have to
// read and sort the whole table first); a scalar subquery, since EXISTS
// drops ORDER BY and LIMIT.
func nothingLive(row string) string {
	return "(SELECT l.id FROM {schema}.tasks l WHERE l.conversation_id = " + row + ".conversation_id" +
		" AND l.status IN (" + sqllit.Quoted(sqllit.Live()) + ") ORDER BY l.conversation_id, l.status LIMIT 1) IS NULL"
}

// DeleteRules are what the guard checks of every task row a DELETE
// removes (docs/design.md §3.9): the delete runs on the prune path (its
// transaction is marked in prune_marks), the task is settled, nothing above it is
// live (no live owner, however far up), and a turn of a conversation that
// still has a live task is not its newest settled turn. A task's children
// cannot outlive it (the ownership foreign key), so a subtree goes only as
// a whole, and only when every task of it is settled; events refer to
// their tasks by foreign key too, so a task an event names goes only with
// that event.
func DeleteRules() []ColumnRule {
	settled := sqllit.Quoted(sqllit.Settled())
	return []ColumnRule{
		{Column: "prune", Value: "{schema}.prune_marked()",
			Why: "only the prune path deletes (tasks.Engine.Prune, the runners' prune job)"},
		{Column: "status", Value: "OLD.status IN (" + settled + ")", Why: "a live task is never deleted"},
		{Column: "owner_task_id", Value: `NOT EXISTS (WITH RECURSIVE up AS (
                SELECT o.id, o.owner_task_id, o.status FROM {schema}.tasks o WHERE o.id = OLD.owner_task_id
                UNION ALL
                SELECT o.id, o.owner_task_id, o.status FROM {schema}.tasks o JOIN up ON o.id = up.owner_task_id)
            SELECT 1 FROM up WHERE up.status NOT IN (` + settled + `))`,
			Why: "nothing live above it still reads it"},
		{Column: "id", Value: `OLD.owner_task_id IS NOT NULL
            OR ` + nothingLive("OLD") + `
            OR (SELECT n.id FROM {schema}.tasks n WHERE n.conversation_id = OLD.conversation_id AND n.owner_task_id IS NULL
                AND n.id > OLD.id AND n.status IN (` + settled + `) ORDER BY n.conversation_id, n.owner_task_id LIMIT 1) IS NOT NULL`,
			Why: "a conversation in use keeps its newest settled turn"},
	}
}
