package store

import (
	"context"
	"os"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
)

// TestMain fails the package if goroutines outlive its tests.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// TestEveryStatementPrepares parses and describes every statement of the
// store, rendered for a freshly migrated schema as New renders it (the
// schema substituted, the column lists and the status lists expanded), on
// the real server: a typo, a column a migration
// dropped or renamed, a parameter whose type the server cannot infer, or
// a table named without {schema} fails here, by the statement's name
// and the .sql file it is in, rather than at the first call that runs it.
//
// Nothing is executed: Parse and Describe only (pgconn's Prepare with the
// anonymous statement), so the test writes nothing. The store names every
// table through {schema} and never relies on search_path; the connection's
// search_path is emptied (pg_catalog alone stays implicit) so that a
// statement that did would fail rather than find a table of public's.
func TestEveryStatementPrepares(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	s, err := New(schema)
	require.NoError(t, err)
	names := statementNames(t)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET search_path = ''`)
	require.NoError(t, err)
	pg := conn.Conn().PgConn()

	require.Len(t, s.sql, len(queries))
	for i, sql := range s.sql {
		if _, err := pg.Prepare(ctx, "", sql, nil); err != nil {
			t.Errorf("%s (store/queries/%s) does not prepare against the migrated schema: %v\n%s",
				names[i], named[queryNames[i]].file, err, sql)
		}
	}
	t.Logf("%d statements prepared in schema %s", len(s.sql), schema)
}

// TestLogKindsAreTheSchemas checks arbortype.LogKinds against the CHECK
// constraint of conversation_log.kind in the migrated schema: a kind the
// schema admits that Go has no constant for, or a constant the schema
// would refuse, fails here.
func TestLogKindsAreTheSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Shared(t)
	rows, err := pool.Query(ctx, `SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
		WHERE c.conrelid = ($1 || '.conversation_log')::regclass AND c.contype = 'c'
		  AND pg_get_constraintdef(c.oid) LIKE '%kind%'`, pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, defs, 1, "conversation_log has one CHECK on kind")
	var inSchema []arbortype.LogKind
	for _, m := range regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(defs[0], -1) {
		inSchema = append(inSchema, arbortype.LogKind(m[1]))
	}
	require.ElementsMatch(t, inSchema, arbortype.LogKinds, "the schema's %s", defs[0])
}
