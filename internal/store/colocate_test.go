package store

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// statementNames returns the name of every query, by index, as the
// variable it is assigned to (qName for the statement Name of store.SQL).
func statementNames(t *testing.T) []string {
	t.Helper()
	names := make([]string, len(queries))
	for i, name := range queryNames {
		names[i] = "q" + name
	}
	return names
}

// distributed are the tables Citus would distribute by conversation, with
// the column that holds the conversation id in each.
var distributed = map[string]string{
	"conversations":       "id",
	"tasks":               "conversation_id",
	"events":              "conversation_id",
	"conversation_log":    "conversation_id",
	"budgets":             "conversation_id",
	"budget_reservations": "conversation_id",
}

var (
	tableRef = regexp.MustCompile(`\{schema\}\.(tasks|conversations|events|conversation_log|budgets|budget_reservations)\b(?:\s+(?:AS\s+)?([a-z_][a-z_0-9]*))?`)
	notAlias = map[string]bool{"where": true, "set": true, "on": true, "join": true, "values": true, "select": true,
		"for": true, "order": true, "group": true, "limit": true, "returning": true, "using": true, "left": true,
		"inner": true, "cross": true, "as": true, "union": true, "and": true, "or": true, "having": true}
	insertCols = regexp.MustCompile(`INSERT INTO \{schema\}\.(\w+)\s*(?:AS\s+\w+\s*)?\(([^)]*)\)`)
	spaces     = regexp.MustCompile(`\s+`)
)

// ref is one mention of a distributed table in a statement.
type ref struct {
	table, alias string
}

// unanchored returns the mentions of distributed tables in sql that are
// not pinned to one conversation. The check is syntactic, on the
// statement as written here (every statement is, by the package's rule):
// a mention is pinned when its conversation column (conversations.id, the
// others' conversation_id) equals one parameter ($n, qualified by the
// mention's alias, or unqualified when the mention has none), when it is
// the table of an INSERT that gives that column, or when its column
// equals (=) the column of a pinned mention. An array of conversations
// (= ANY($n)) pins nothing: Citus sends it to every shard it names.
func unanchored(sql string) []ref {
	sql = spaces.ReplaceAllString(sql, " ")
	var refs []ref
	var inserted []bool // whether the mention is an INSERT's target that gives the column
	for _, m := range tableRef.FindAllStringSubmatchIndex(sql, -1) {
		table, alias := sql[m[2]:m[3]], ""
		if m[4] >= 0 {
			alias = strings.ToLower(sql[m[4]:m[5]])
		}
		if notAlias[alias] {
			alias = ""
		}
		refs = append(refs, ref{table, alias})
		ins := false
		if im := insertCols.FindStringSubmatch(sql[max(0, m[0]-len("INSERT INTO ")):]); im != nil &&
			strings.HasPrefix(sql[max(0, m[0]-len("INSERT INTO ")):], "INSERT INTO") && im[1] == table {
			for _, c := range strings.Split(im[2], ",") {
				ins = ins || strings.TrimSpace(c) == distributed[table]
			}
		}
		inserted = append(inserted, ins)
	}
	pinned := make([]bool, len(refs))
	col := func(r ref) string {
		if r.alias != "" {
			return regexp.QuoteMeta(r.alias) + `\.` + distributed[r.table]
		}
		return `(?:^|[^.\w])` + distributed[r.table]
	}
	// ambiguous says whether an unqualified column could be another
	// mention's: one without an alias, of a table that has the column too
	// (every distributed table has id; all but conversations have
	// conversation_id). An INSERT's target is not in scope elsewhere.
	ambiguous := func(i int) bool {
		for j, o := range refs {
			if j == i || o.alias != "" || inserted[j] || o.table == refs[i].table {
				continue
			}
			if distributed[refs[i].table] == "id" || o.table != "conversations" {
				return true
			}
		}
		return false
	}
	for i, r := range refs {
		if (r.alias != "" || !ambiguous(i)) && regexp.MustCompile(col(r)+`\s*=\s*\$\d+\b`).MatchString(sql) {
			pinned[i] = true
		}
		if inserted[i] {
			pinned[i] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for i, r := range refs {
			if pinned[i] || r.alias == "" {
				continue
			}
			for j, o := range refs {
				if !pinned[j] || o.alias == "" || i == j {
					continue
				}
				a, b := col(r), col(o)
				if regexp.MustCompile(a + `\s*=\s*` + b + `\b|` + b + `\s*=\s*` + a + `\b`).MatchString(sql) {
					pinned[i], changed = true, true
					break
				}
			}
		}
	}
	var out []ref
	for i, r := range refs {
		if !pinned[i] {
			out = append(out, r)
		}
	}
	return out
}

// crossConversation are the statements that span conversations by
// design, each with its reason: the runner's, the waker's, the checker's
// and retention's. On Citus each runs on every shard (or on every shard
// its array names); docs/scaling.md says what that costs. Reviewed: adding
// one needs a reason here and a line in docs/scaling.md.
var crossConversation = map[string]string{
	// The node claim and what the node does with the set it holds.
	"qOpenConversations":       "node claim: finds and takes the unheld conversations with work, across all",
	"qOpenNamed":               "node claim: takes the named conversations that notifications announced",
	"qCountOpenable":           "node claim: counts openable conversations (the producer's backlog)",
	"qClaimIn":                 "node claim: starts the runnable tasks of a batch of held conversations",
	"qClaimHeld":               "node claim: starts the runnable tasks of every conversation the node holds",
	"qRunningIn":               "node: the running tasks of a batch of held conversations",
	"qToRepair":                "node: the waits to repair in a batch of held conversations",
	"qHeldBy":                  "node: the conversations a node holds, with their epochs",
	"qLockHeld":                "node: locks the held conversations of a batch, in id order",
	"qLockForFlush":            "batching completer: locks the conversations of one flush",
	"qEndHolder":               "holders: a holder's row, once no conversation names it (holders is a reference table)",
	"qPruneHolders":            "holders: rows of lives long over that no conversation names (holders is a reference table)",
	"qReopen":                  "node: the node's own conversations after its fence fired, by its holder row",
	"qReleaseIdle":             "lease release: every idle held conversation in one statement",
	"qLockConversations":       "batch create and flush: locks several conversations in id order",
	"qEnsureLockConversations": "batch create: creates the new conversations of a batch and locks the others, in id order",
	// The batching completer: one statement for a flush over many conversations.
	"qCompleteMany":       "batching completer: completes a flush's tasks across conversations",
	"qCompleteHeld":       "batching completer: settles the owners a flush completed",
	"qWakeSatisfied":      "batching completer: wakes the owners whose waits a flush satisfied",
	"qWaitMany":           "batching completer: parks a flush's waits",
	"qWakeMany":           "batching completer: wakes a flush's tasks",
	"qLockRunStates":      "batching completer: locks a flush's tasks",
	"qChildStates":        "batching completer: the children of a flush's owners",
	"qRunStates":          "runner: the states of the runs in flight, across held conversations",
	"qLockOwners":         "batch create and flush: locks the owners of tasks of several conversations",
	"qTasksByKeys":        "batch create: idempotency keys of several conversations (conversation_id = ANY)",
	"qSettleMany":         "abort and flush: settles a set of tasks by id (one conversation's or a flush's)",
	"qRecoverTasks":       "recovery: moves a set of tasks by id back to pending",
	"qClaimTasksUnfenced": "node claim without a lease (reconcile-only): a set of tasks by id",
	// Slow polls and scans.
	"qStaleUnknownKinds":           "runner's slow poll: pending tasks of kinds no runner knows, across all",
	"qSleepingDue":                 "waker's slow poll: sleeps due within the horizon, across all",
	"qLiveDeadlines":               "deadline sweep: live tasks past their deadline, across all",
	"qExpiredInQueue":              "queue expiry sweep: pending tasks past their time to live, across all",
	"qAdoptRuns":                   "concurrency limit set: the runs of its key under way, across the held conversations",
	"qCountSlots":                  "concurrency limit set: counts the runs naming it, across the held conversations",
	"qSlotCounts":                  "checker: every limit's count beside the runs naming it, across the held conversations",
	"qConversationIDs":             "checker's full scan: every conversation",
	"qOrphanRows":                  "checker's full scan: rows naming a conversation that does not exist",
	"qForgedLogEvents":             "checker: an event id a log entry names, looked up in every conversation (an entry naming another conversation's event is forged)",
	"qLiveConversations":           "inspect (arbor ls): live conversations, across all",
	"qPruneLog":                    "retention: old log entries, across all",
	"qPruneCandidates":             "retention: settled turns older than the cutoff, across all, oldest first",
	"qEmptyConversations":          "retention: conversations left without tasks, across all",
	"qLapsedReservations":          "budget sweep: conversations holding a reservation whose run is over, across all",
	"qOverWallTime":                "wall-time sweep: live tasks under a fail wall-time budget that is over, across all",
	"qRecentConversations":         "inspect (web view): the conversations of the newest tasks, across all",
	"qConversationsByID":           "inspect (web view): a bounded page of conversations along the primary key, across all",
	"qConversationsByRecent":       "inspect (web view): the conversations of a bounded window of the newest tasks, across all",
	"qLiveCounts":                  "inspect (web view): live tasks counted by status, up to a bound, across all",
	"qAwaitsAfter":                 "inspect (web view): a page of the awaits of every conversation, along the awaiting index",
	"qHolders":                     "inspect (web view): the holders, each with the conversations it holds counted (holders is a reference table)",
	"qRecentRestarts":              "inspect (web view): restarted tasks among a bounded window of the newest, across all",
	"qLastLogSeq":                  "inspect (web view): the newest entry of any conversation's log (one probe of the primary key)",
	"qConversationStates":          "inspect (web view): queued and stuck work of a page of conversations (an array of ids)",
	"qSettledTurnsPerMinute":       "inspect (web view): the turns settled in the last hour, per tenant, a bounded read of the settled roots' index",
	"qStartedTurnsPerMinute":       "inspect (web view): the turns started in the last hour, per tenant, among a bounded window of the newest tasks",
	"qPendingByTenant":             "inspect (web view): each tenant's pending depth (bounded) and head of queue, along the fair claim's index",
	"qCheckTenantBudgets":          "the checker's sums of every tenant budget over the reservations of all the tenant's conversations",
	"qLockTenantLiveConversations": "a tenant budget's raise: every conversation of the tenant with a live task, locked to wake its parked tasks",
	// Fork copies one conversation into another: two conversations by design.
	"qInsertForkTasks":  "fork: copies the source's tasks into the new conversation (on Citus an INSERT … SELECT between two shards)",
	"qInsertForkEvents": "fork: copies the source's events into the new conversation",
	"qNextTaskIDs":      "fork: ids from the tasks' sequence (names the table, reads no row)",
	"qNextEventIDs":     "fork: ids from the events' sequence (names the table, reads no row)",
}

// entryPoints are the statements that find a task, or an await, by its id
// or token alone: the first statement of a call addressed by task id
// (Engine.Get, Abort, Cancel, WakeNow, a lease's Start, EmitToken, an
// engine-level Fail or Complete), which must learn the task's conversation
// before anything can be routed to it. Everything after them in a
// transaction names the conversation. On Citus each is one index probe on
// every shard (docs/scaling.md); a caller that knows the conversation
// skips them where an API takes it.
var entryPoints = map[string]string{
	"qGetTask":                "reads a task by id (Engine.Get and the reads after a lost commit answer)",
	"qGetTasks":               "reads tasks by ids (Engine.GetMany; a batch create's owners, of several conversations)",
	"qAwaitContexts":          "reads the saved states of a page of awaits by task ids (the web view's approvals, of several conversations)",
	"qTaskConversation":       "finds a task's conversation: the entry point of a task-addressed call",
	"qTaskByAwaitToken":       "finds an await by a token of the older form, which does not name its task (EmitToken): a client posts the token alone",
	"qLockConversationOfTask": "locks a task's conversation, found from the task, then the task by (conversation, id)",
}

// TestEveryStatementIsColocatable fails on a statement of the store that
// touches a table Citus would distribute by conversation and is not pinned
// to one conversation (see unanchored), unless it is listed above.
func TestEveryStatementIsColocatable(t *testing.T) {
	t.Parallel()
	names := statementNames(t)
	seen := map[string]bool{}
	colocated := 0
	for i, sql := range queries {
		name := names[i]
		seen[name] = true
		u := unanchored(sql)
		_, cross := crossConversation[name]
		_, debt := entryPoints[name]
		switch {
		case len(u) > 0 && !cross && !debt:
			t.Errorf("%s is not co-locatable by conversation_id (%v unpinned): filter by conversation_id = $n (conversations: id = $n) "+
				"or join on it, or, if it spans conversations by design, add it to crossConversation (an entry point by task id: entryPoints) with its reason and to docs/scaling.md:\n%s",
				name, u, sql)
		case len(u) == 0 && (cross || debt):
			t.Errorf("%s is co-locatable now: take it off its list", name)
		case len(u) == 0 && distributedRef.MatchString(sql):
			colocated++
		}
	}
	for _, list := range []map[string]string{crossConversation, entryPoints} {
		for name := range list {
			if !seen[name] {
				t.Errorf("%s is listed but is no statement of the store", name)
			}
		}
	}
	t.Logf("%d statements co-located, %d cross-conversation by design, %d entry points by task id", colocated, len(crossConversation), len(entryPoints))
}

var distributedRef = regexp.MustCompile(`\{schema\}\.(tasks|conversations|events|conversation_log|budgets|budget_reservations)\b`)

// TestUnanchored checks the checker on statements of known shape.
func TestUnanchored(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]int{
		`SELECT * FROM {schema}.tasks WHERE conversation_id = $1`:                                                     0,
		`SELECT * FROM {schema}.tasks WHERE id = $1`:                                                                  1,
		`SELECT * FROM {schema}.tasks WHERE conversation_id = ANY($1)`:                                                1,
		`SELECT id FROM {schema}.conversations WHERE id = $1 FOR NO KEY UPDATE`:                                       0,
		`SELECT c.id FROM {schema}.conversations c JOIN {schema}.tasks t ON t.conversation_id = c.id WHERE c.id = $2`: 0,
		`SELECT c.id FROM {schema}.conversations c JOIN {schema}.tasks t ON t.owner_task_id = c.id WHERE c.id = $2`:   1,
		`INSERT INTO {schema}.events (conversation_id, name) VALUES ($1, $2)`:                                         0,
		`INSERT INTO {schema}.events (name) VALUES ($1)`:                                                              1,
		`SELECT * FROM {schema}.conversations WHERE id = (SELECT conversation_id FROM {schema}.tasks WHERE id = $1)`:  2,
	} {
		require.Len(t, unanchored(sql), want, sql)
	}
}
