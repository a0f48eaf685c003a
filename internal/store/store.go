package store

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
	publicstore "github.com/arborhq/arbor/store"
)

// DB is what the store runs its queries on: a pool, a connection or a
// transaction. Writes must run in a transaction the caller owns.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store holds arbor's queries rendered for one schema.
type Store struct {
	schema string
	sql    []string // indexed by query
}

// New returns a Store for schema ("" means migrations.SchemaDefault): every
// statement of store.SQL with its placeholders replaced, {schema} by the
// quoted schema and the lists by the Go lists they must match (the columns
// the scanners read, the statuses of package arbortype).
func New(schema string) (*Store, error) {
	if schema == "" {
		schema = migrations.SchemaDefault
	}
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	s := &Store{schema: schema, sql: make([]string, len(queries))}
	r := strings.NewReplacer(
		"{task_columns}", taskColumns,
		"{run_columns}", runColumns,
		"{summary_columns}", summaryColumns,
		"{live}", liveStatusList,
		"{settled}", settledStatusList,
		"{schema}", pgx.Identifier{schema}.Sanitize(),
	)
	for i, sql := range queries {
		s.sql[i] = r.Replace(sql)
	}
	return s, nil
}

// startable is {startable} of store.SQL, filled in before the other
// placeholders: what a claim asks of a pending task t besides its status,
// so that it does not try what it would not start (docs/design.md §3.15):
// no concurrency limit of its keys full as last committed (the start's
// trigger, task_slots, decides under the limits' locks; this only keeps
// the claim from picking work that would be skipped), and not a task
// expired in its queue. The limits are probed by
// primary key, a scalar subquery the planner cannot turn into a join.
const startable = `NOT coalesce((SELECT true FROM {schema}.concurrency_limits cl
        WHERE cl.key IN ('tenant:' || t.tenant, 'kind:' || t.kind, 'key:' || t.concurrency_key)
          AND cl.running >= cl.max LIMIT 1), false)
      AND (t.queue_expires_at IS NULL OR t.started_at IS NOT NULL OR t.queue_expires_at > now())`

// weight is {weight} of store.SQL: the weight of tenant x.tenant in the
// fair claim (1 for a tenant with no row).
const weight = `coalesce((SELECT tw.weight FROM {schema}.tenants tw WHERE tw.tenant = x.tenant), 1)`

// Busy is what a node runs now, by tenant: the runs in flight that hold one
// of its worker slots. The fair claim orders its candidates by their
// tenant's share: (runs in flight + rank in the claim - 1) / weight.
type Busy struct {
	Tenants []string
	Runs    []int32
}

// logStatus is {log_status} of store.SQL, filled in before the other
// placeholders (it holds {schema}): the INSERT that appends one status
// entry to the conversation log per row of w, the CTE of task rows a
// status write returns — an abort's settles in the order they settled
// (leaves first), every other row by id. Its payload names the owner, the
// error's code and message of a failed, aborted, cancelled or orphaned
// task, and what a sleeping task awaits. Every statement that writes a
// task's status or inserts a task appends its entries so
// (TestEveryStatusWriteIsLogged), in one text kept here.
const logStatus = `INSERT INTO {schema}.conversation_log (conversation_id, task_id, kind, status, name, payload)
    SELECT w.conversation_id, w.id, 'status', w.status, w.kind,
           nullif(jsonb_strip_nulls(jsonb_build_object(
               'owner', w.owner_task_id,
               'error', CASE WHEN w.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN w.error->>'code' END,
               'message', CASE WHEN w.status IN ('failed', 'aborted', 'cancelled', 'orphaned') THEN nullif(w.error->>'message', '') END,
               'await', CASE WHEN w.status = 'sleeping' THEN w.await_name END)), '{}'::jsonb)
    FROM w ORDER BY w.settle_seq NULLS FIRST, w.id`

// liveStatusList is the live statuses as an SQL list, for "status IN
// ({live})": rendered from arbortype.LiveStatuses, so that no query spells
// them by hand. (The partial indexes of migrations/ spell the same list.)
var liveStatusList = func() string {
	quoted := make([]string, len(arbortype.LiveStatuses))
	for i, st := range arbortype.LiveStatuses {
		quoted[i] = "'" + string(st) + "'"
	}
	return strings.Join(quoted, ", ")
}()

// Schema returns the schema the store's queries run in.
func (s *Store) Schema() string { return s.schema }

// query names one of arbor's SQL statements.
type query int

// queries are all of arbor's SQL, indexed by query, and queryNames their
// names: each file of this package defines, with define, the statements
// of its concept beside their Go wrappers, and reads their text from the
// named queries of store.SQL (the top-level package store).
var (
	queries    []string
	queryNames []string
)

// named is every statement of store.SQL by name, read once at start-up.
var named = func() map[string]namedQuery {
	m, err := parseQueries(publicstore.SQL)
	if err != nil {
		panic(err)
	}
	return m
}()

// namedQuery is one statement of store.SQL and the file it is in.
type namedQuery struct {
	file, sql string
}

// define returns the query of the statement called name in store.SQL. A
// name store.SQL does not hold is a mistake of this package's, caught by
// every test that loads it (and TestEveryNamedQueryIsDefined checks the
// converse: no statement of store.SQL goes unused).
func define(name string) query {
	q, ok := named[name]
	if !ok {
		panic("internal/store: no statement " + name + " in store.SQL")
	}
	queries = append(queries, strings.NewReplacer("{log_status}", logStatus, "{startable}", startable, "{weight}", weight).Replace(q.sql))
	queryNames = append(queryNames, name)
	return query(len(queries) - 1)
}

// parseQueries reads the named statements of every .sql file of fsys's
// queries folder: a line "-- name: Name" starts a statement, which runs to
// its closing semicolon at the end of a line; comment lines between
// statements document them and are not sent.
func parseQueries(fsys fs.FS) (map[string]namedQuery, error) {
	files, err := fs.Glob(fsys, "queries/*.sql")
	if err != nil {
		return nil, err
	}
	m := map[string]namedQuery{}
	for _, file := range files {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		name := ""
		var body []string
		for i, line := range strings.Split(string(b), "\n") {
			switch {
			case name == "" && strings.HasPrefix(line, "-- name: "):
				name = strings.TrimSpace(strings.TrimPrefix(line, "-- name: "))
				if _, dup := m[name]; dup || name == "" {
					return nil, fmt.Errorf("%s:%d: statement name %q empty or used twice", file, i+1, name)
				}
			case name == "" && (line == "" || strings.HasPrefix(line, "--")):
			case name == "":
				return nil, fmt.Errorf("%s:%d: SQL outside a named statement", file, i+1)
			case strings.HasSuffix(line, ";"):
				body = append(body, strings.TrimSuffix(line, ";"))
				m[name] = namedQuery{file: path.Base(file), sql: strings.Join(body, "\n")}
				name, body = "", nil
			default:
				body = append(body, line)
			}
		}
		if name != "" {
			return nil, fmt.Errorf("%s: statement %s has no closing semicolon", file, name)
		}
	}
	return m, nil
}
