package guardrules

// The record guards. Besides tasks and conversations, arbor keeps records
// that must change only as arbor changes them: the events (no event is
// lost, each delivered once), the conversation log (append-only), the
// budgets and their reservations (what was spent is never unspent), and the
// holders (a node's lease, which fences its runs). RecordRules says, table
// by table, what a new row must look like, which columns never change,
// which change only under a condition, and when a row may be deleted; the
// database trigger functions generated from it (fsmgen.RecordGuardSQL) refuse
// everything else, so a bug or a hand-written statement cannot forge one.
//
// Two checks span rows, not one row's change, and are written by hand
// beside these: the log's INSERT check, that each entry names what its task
// or event is and is written by the statement that changed it
// (log_guard_insert in migrations/sql/001_baseline.up.sql), and the
// budgets' sums, checked at commit against their reservations whenever a
// budget or a reservation changed (budget_sums_guard and
// reservation_sums_guard, same file). A third guards the prune's marks
// themselves (prune_mark_guard): a mark names the transaction that inserts
// it.

// RecordTable is the guard of one table of records.
type RecordTable struct {
	// Table is the table; Function the trigger function that guards its
	// rows (called for the operations its triggers name: an insert before
	// the row is written, an update after).
	Table, Function string
	// Why says what the table's rows are, for the generated code and docs.
	Why string
	// Insert are the forms a new row may take: it must meet one of them.
	// Empty: any insert the table's constraints accept.
	Insert []Form
	// InsertRefusal is the message of an insert that meets none.
	InsertRefusal string
	// AppendOnly refuses every update: the row never changes once written.
	// Noun names such a row in the refusal.
	AppendOnly bool
	Noun       string
	// Key is the SQL (over OLD) that names a row in a refusal's message.
	Key string
	// Fixed are the columns that never change; FixedRefusal says so.
	Fixed        []string
	FixedRefusal string
	// Changes are the columns that change only under a condition, checked
	// in order: when any of a rule's columns changed, its condition must
	// hold.
	Changes []Change
	// Free are the columns no rule of this table holds, with why: the
	// user's to set, or checked by a rule across rows. Every other column
	// is Fixed or in a Change (a test holds the migrated schema to it).
	Free    []string
	FreeWhy string
	// Delete, when not nil, is the condition of a delete (the row trigger
	// runs for DELETE). Nil: the table's delete trigger is the shared
	// prune-only one (record_guard_delete).
	Delete *Form
}

// Form is a condition a row must meet, with why, and the message of a
// refusal (a format for RAISE; its arguments in Args).
type Form struct {
	Why     string
	Cond    string
	Refusal string
	Args    string
}

// Change says when some columns of a record may change.
type Change struct {
	Columns []string
	Form
}

// forkEventCopy is the insert form of a fork's copy of an event
// (internal/store's CopyHistory): made in the fork's own transaction (the
// conversation was inserted by it: stamped now), naming forked tasks only
// — the copy of the task the event was addressed to, if any, and the copy
// of the one it was delivered to, if any — and equal, field for field, to
// an event of the source conversation addressed (or, addressed to the
// conversation, delivered) to the source of that copy. So a copy can
// neither be delivered to a task of the fork's own (a live turn) nor carry
// a payload, a name or stamps its source does not have (issue 38, G3).
// The source is found by the copy's address: events_task_idx or
// events_delivered_to_idx.
const forkEventCopy = `(SELECT c.created_at FROM {schema}.conversations c WHERE c.id = NEW.conversation_id) = now()
            AND (NEW.task_id IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.task_id
                AND t.conversation_id = NEW.conversation_id AND t.forked_from IS NOT NULL))
            AND (NEW.delivered_to IS NULL OR EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.delivered_to
                AND t.conversation_id = NEW.conversation_id AND t.forked_from IS NOT NULL))
            AND (NEW.task_id IS NULL OR NEW.delivered_to IS NULL OR NEW.delivered_to = NEW.task_id)
            AND EXISTS (SELECT 1 FROM {schema}.tasks ct JOIN {schema}.tasks st ON st.id = ct.forked_from
                WHERE ct.id = coalesce(NEW.task_id, NEW.delivered_to) AND ct.conversation_id = NEW.conversation_id
                AND CASE WHEN NEW.task_id IS NOT NULL
                    THEN EXISTS (SELECT 1 FROM {schema}.events s WHERE s.conversation_id = st.conversation_id AND s.task_id = st.id
                        AND (s.delivered_to IS NULL) = (NEW.delivered_to IS NULL) AND (s.delivered_to IS NULL OR s.delivered_to = st.id)
                        AND s.name = NEW.name AND s.payload IS NOT DISTINCT FROM NEW.payload
                        AND s.idempotency_key IS NOT DISTINCT FROM NEW.idempotency_key AND s.queued = NEW.queued
                        AND s.emitted_at = NEW.emitted_at AND s.delivered_at IS NOT DISTINCT FROM NEW.delivered_at)
                    ELSE EXISTS (SELECT 1 FROM {schema}.events s WHERE s.conversation_id = st.conversation_id AND s.delivered_to = st.id
                        AND s.task_id IS NULL
                        AND s.name = NEW.name AND s.payload IS NOT DISTINCT FROM NEW.payload
                        AND s.idempotency_key IS NOT DISTINCT FROM NEW.idempotency_key AND s.queued = NEW.queued
                        AND s.emitted_at = NEW.emitted_at AND s.delivered_at IS NOT DISTINCT FROM NEW.delivered_at) END)`

// PruneOnly is the condition of a delete on the prune path: the
// transaction inserted its own id into prune_marks (internal/store.MarkPrune), which
// only the prune's role may write.
const PruneOnly = "{schema}.prune_marked()"

// RecordRules are the guards of the record tables, in the order the
// generated code defines them.
func RecordRules() []RecordTable {
	return []RecordTable{
		{
			Table: "events", Function: "event_guard",
			Why: "an event is inserted by an emit (undelivered, stamped now) or by a fork as a copy, in the fork's own transaction (it names forked tasks only, the copies of the task it was addressed or delivered to, and is their source's event field for field); it changes once, when it is delivered: to the task it is addressed to (or, addressed to the conversation, to any of its tasks), which is parked in an await of its name (the delivery comes before the task's wake, in the same transaction), stamped greatest(now(), its emission) so that its stamps follow the conversation lock's order; nothing else of it ever changes",
			Insert: []Form{
				{Why: "an emit: undelivered, stamped now", Cond: "NEW.delivered_to IS NULL AND NEW.emitted_at = now()"},
				{Why: "a fork's copy, in the transaction that made the fork (its conversation is stamped now): it names forked tasks only (the copies of the task it was addressed to, or delivered to, or both) and is an event of their sources, copied field for field",
					Cond: forkEventCopy},
			},
			InsertRefusal: "an event is inserted undelivered by an emit, or as a fork''s copy of one",
			Key:           "OLD.id",
			Fixed:         []string{"id", "conversation_id", "task_id", "name", "payload", "idempotency_key", "queued", "emitted_at"},
			FixedRefusal:  "event %: only its delivery ever changes",
			Changes: []Change{
				{Columns: []string{"delivered_to", "delivered_at"}, Form: Form{
					Why:     "delivered once, stamped greatest(now(), its emission), never undelivered",
					Cond:    "OLD.delivered_to IS NULL AND NEW.delivered_to IS NOT NULL AND NEW.delivered_at = greatest(now(), OLD.emitted_at)",
					Refusal: "event %: it is delivered once, stamped now, and never undelivered", Args: "OLD.id"}},
				{Columns: []string{"delivered_to", "delivered_at"}, Form: Form{
					Why: "to a task of its address that awaits it",
					Cond: `(OLD.task_id IS NULL OR OLD.task_id = NEW.delivered_to)
            AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.delivered_to AND t.conversation_id = NEW.conversation_id
                AND t.status = 'sleeping' AND t.await_name = NEW.name)`,
					Refusal: "event % is delivered only to a task of its address that awaits it (task %)", Args: "OLD.id, NEW.delivered_to"}},
			},
		},
		{
			Table: "conversation_log", Function: "log_guard",
			Why:        "the log is append-only: an entry, once written, never changes (what an insert may write is the log's INSERT check)",
			AppendOnly: true, Noun: "log entry",
			Key:     "OLD.seq",
			Free:    []string{"seq", "conversation_id", "task_id", "kind", "status", "name", "payload", "at"},
			FreeWhy: "written once, as the INSERT check accepts, and never changed",
		},
		{
			Table: "budgets", Function: "budget_guard",
			Why: "a budget is inserted with nothing carried, stamped now (what its scope spent and holds already is counted by the insert itself); its scope and counter never change; its spend only grows (a reservation's close, a spend); carried grows only on the prune path (the spend of the pruned tasks' reservations, carried into the conversation's budget); its max and action are the user's to set (SetBudget); spent and reserved agree with its reservations at commit",
			Insert: []Form{
				{Why: "nothing carried, stamped now", Cond: "NEW.carried = 0 AND NEW.created_at = now()"},
			},
			InsertRefusal: "a budget is inserted with nothing carried, stamped now",
			Free:          []string{"max", "on_exhausted", "updated_at", "reserved"},
			FreeWhy:       "max and on_exhausted are the user's (SetBudget, stamped updated_at); reserved is the open reservations' sum, checked at commit with spent",
			Key:           "OLD.counter, OLD.conversation_id",
			Fixed:         []string{"conversation_id", "task_id", "counter", "created_at"},
			FixedRefusal:  "budget % of %: its scope and counter never change",
			Changes: []Change{
				{Columns: []string{"spent"}, Form: Form{
					Why: "its spend only grows", Cond: "NEW.spent > OLD.spent",
					Refusal: "budget % of %: its spend only grows (% -> %)", Args: "OLD.counter, OLD.conversation_id, OLD.spent, NEW.spent"}},
				{Columns: []string{"carried"}, Form: Form{
					Why: "only the prune carries spend, into the conversation's budget", Cond: "NEW.carried > OLD.carried AND NEW.task_id IS NULL AND " + PruneOnly,
					Refusal: "budget % of %: only the prune carries spend, into the conversation''s budget", Args: "OLD.counter, OLD.conversation_id"}},
			},
		},
		{
			Table: "budget_reservations", Function: "reservation_guard",
			Why: "a reservation is made by a run of its task (the task running, with the reservation's token), stamped now, open or (a spend) closed at once; it changes once, when it is closed (a record, or in full, lapsed, once its run is over; the record is fenced by the close itself, not by the run still holding the task: core.RecordBudget); nothing else of it ever changes",
			Insert: []Form{
				{Why: "by a run of its task, stamped now, open or closed in full at once",
					Cond: `NEW.created_at = now() AND NOT NEW.lapsed AND (NEW.actual IS NULL OR (NEW.actual = NEW.amount AND NEW.closed_at = now()))
            AND EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.id = NEW.task_id AND t.conversation_id = NEW.conversation_id
                AND t.status = 'running' AND t.token = NEW.run_token)`},
			},
			InsertRefusal: "a reservation is made by a run of its task, stamped now",
			Key:           "OLD.id",
			Fixed:         []string{"id", "conversation_id", "task_id", "counter", "run_token", "idempotency_key", "amount", "created_at"},
			FixedRefusal:  "reservation %: only its close ever changes",
			// Guarded by a hand-written trigger of migration 004
			// (reservation_tenant_guard), not by the generated function.
			Free:    []string{"tenant_budgets"},
			FreeWhy: "the tenant budgets it charged, written with it and never changed (migration 004's reservation_tenant_guard)",
			Changes: []Change{
				{Columns: []string{"actual", "lapsed", "closed_at"}, Form: Form{
					Why:     "closed once, stamped now, never reopened",
					Cond:    "OLD.actual IS NULL AND NEW.actual IS NOT NULL AND NEW.closed_at = now()",
					Refusal: "reservation %: it is closed once, stamped now, and never reopened", Args: "OLD.id"}},
			},
		},
		{
			Table: "holders", Function: "holder_guard",
			Why: "a holder row (a node's lease) is inserted live, stamped now; only its renewal changes it, and only while it is live: its deadline never comes closer (a deadline brought back lapses a holder whose handlers still run, and another node would take its conversations over under them) and it is stamped renewed now — except once, when another live holder proved its process dead (a runner of the same host got the lock of its life's file): ended_by then names that holder, and its deadline is put in the past; its name, id and birth never change; a lease is at most a day; it is deleted only once no conversation names it",
			Insert: []Form{
				{Why: "live, stamped now, for at most a day, never ended", Cond: "NEW.created_at = now() AND NEW.renewed_at = now() AND NEW.expires_at >= now() AND NEW.expires_at <= now() + interval '24 hours' AND NEW.ended_by IS NULL"},
			},
			InsertRefusal: "a holder is inserted live, stamped now, for at most a day, never ended",
			Key:           "OLD.id, OLD.name",
			Fixed:         []string{"id", "name", "created_at"},
			FixedRefusal:  "holder % (%): only its renewal ever changes",
			Changes: []Change{
				{Columns: []string{"ended_by"}, Form: Form{
					Why:     "ended once, while live, by another holder whose row is live, its deadline put in the past and its renewal stamp kept",
					Cond:    "OLD.ended_by IS NULL AND NEW.ended_by IS NOT NULL AND NEW.ended_by <> OLD.id AND OLD.expires_at >= now() AND NEW.expires_at < now() AND NEW.renewed_at = OLD.renewed_at AND EXISTS (SELECT 1 FROM {schema}.holders p WHERE p.id = NEW.ended_by AND p.expires_at >= now())",
					Refusal: "holder % (%) is ended once, while live, by another live holder that proved its death, its deadline put in the past", Args: "OLD.id, OLD.name"}},
				{Columns: []string{"expires_at", "renewed_at"}, Form: Form{
					Why:     "renewed only while live and never ended, stamped now, its deadline never closer (or ended, above)",
					Cond:    "(OLD.expires_at >= now() AND OLD.ended_by IS NULL AND NEW.ended_by IS NULL AND NEW.expires_at >= OLD.expires_at AND NEW.renewed_at = now()) OR (OLD.ended_by IS NULL AND NEW.ended_by IS NOT NULL)",
					Refusal: "holder % (%) is renewed only while live, stamped now, and its deadline never comes closer", Args: "OLD.id, OLD.name"}},
				{Columns: []string{"expires_at"}, Form: Form{
					Why:     "a lease is at most a day (a deadline years away would hold its conversations for good)",
					Cond:    "NEW.expires_at <= now() + interval '24 hours'",
					Refusal: "holder % (%): a lease is at most a day, not until %", Args: "OLD.id, OLD.name, NEW.expires_at"}},
			},
			Delete: &Form{
				Why:     "once no conversation names it",
				Cond:    "NOT EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = OLD.id)",
				Refusal: "holder % (%) is deleted only once it holds no conversation", Args: "OLD.id, OLD.name"},
		},
	}
}
