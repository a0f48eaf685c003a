package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	quoted := pgx.Identifier{schema}.Sanitize()
	for i, sql := range queries {
		sql = strings.ReplaceAll(sql, "{task_columns}", taskColumns)
		s.sql[i] = strings.ReplaceAll(sql, "{schema}", quoted)
	}
	return s, nil
}

// Schema returns the schema the store's queries run in.
func (s *Store) Schema() string { return s.schema }

// query names one of arbor's SQL statements.
type query int

// queries are all of arbor's SQL, indexed by query. Each file of this package
// defines the statements of its concept beside their Go wrappers.
var queries []string

func define(sql string) query {
	queries = append(queries, sql)
	return query(len(queries) - 1)
}
