package store

import (
	"context"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
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

// New returns a Store for schema ("" means migrations.SchemaDefault).
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
		"{live}", liveStatusList,
		"{schema}", pgx.Identifier{schema}.Sanitize(),
	)
	for i, sql := range queries {
		s.sql[i] = r.Replace(sql)
	}
	return s, nil
}

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

// queries are all of arbor's SQL, indexed by query. Each file of this package
// defines the statements of its concept beside their Go wrappers.
var queries []string

// expand replaces the named parameters of a shared fragment (such as
// claimSet's $status) with the positional ones of one statement, given as
// name, position pairs.
func expand(sql string, pairs ...string) string {
	return strings.NewReplacer(pairs...).Replace(sql)
}

// querySites are where each of queries is defined (file and line of its
// define call), indexed by query: the co-location test (colocate_test.go)
// names a statement by the variable it is assigned to there.
var querySites []querySite

type querySite struct {
	file string
	line int
}

func define(sql string) query {
	_, file, line, _ := runtime.Caller(1)
	queries = append(queries, sql)
	querySites = append(querySites, querySite{file, line})
	return query(len(queries) - 1)
}
