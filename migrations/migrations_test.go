package migrations_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/guardrules"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/migrations"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func tableExists(t *testing.T, db migrations.Querier, schema, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, table}.Sanitize()).Scan(&ok))
	return ok
}

// TestUpDownUp applies every migration, reverts them all and applies
// them again: the schema after the second up is the first one's, object
// for object (describe), and the down left nothing of arbor's or River's.
func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	schema := testdb.Name("arbor_mig")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })

	m, err := migrations.New(pool, schema, nil)
	require.NoError(t, err)

	err = migrations.Check(ctx, pool, schema)
	require.ErrorIs(t, err, migrations.ErrVersionMismatch)
	require.Contains(t, err.Error(), "version 0")

	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Versions(), applied)
	require.NoError(t, migrations.Check(ctx, pool, schema))
	require.True(t, tableExists(t, pool, schema, "tasks"))
	require.True(t, tableExists(t, pool, schema, "river_job"), "River's tables are migrated alongside")
	first := describe(t, pool, schema)

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "re-running up is a no-op")

	reverted, err := m.Down(ctx, 0)
	require.NoError(t, err)
	newestFirst := migrations.Versions()
	slices.Reverse(newestFirst)
	require.Equal(t, newestFirst, reverted, "down reverts every version, newest first")
	require.Empty(t, describe(t, pool, schema), "down to 0 leaves nothing of arbor's or River's in the schema")
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, v)

	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, schema))
	require.Equal(t, first, describe(t, pool, schema), "the schema after up, down and up again is the first up's")
}

// TestSQLIsWhatUpApplies: the SQL package migrations exports for other
// tools (SQL), applied by hand in a schema of its own, makes the schema
// the Migrator makes, River's tables aside, records its versions so that
// Check passes; its down removes all of it.
func TestSQLIsWhatUpApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, migrated := testdb.Fresh(t)
	byHand := testdb.Name("arbor_by_hand")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+byHand+` CASCADE`) })
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+byHand)
	require.NoError(t, err)
	for _, v := range migrations.Versions() {
		up, _, err := migrations.SQL(v, byHand)
		require.NoError(t, err)
		require.NotContains(t, up, "{schema}")
		_, err = pool.Exec(ctx, up)
		require.NoError(t, err, "migration %d up", v)
	}
	arbors := func(d []string) []string {
		return slices.DeleteFunc(d, func(s string) bool { return strings.Contains(s, "river_") })
	}
	want := arbors(describe(t, pool, migrated))
	require.NotEmpty(t, want)
	require.Equal(t, want, describe(t, pool, byHand))
	v, err := migrations.Version(ctx, pool, byHand)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v, "the SQL records the versions it applied, as the Migrator does")
	require.NoError(t, migrations.Check(ctx, pool, byHand))
	for _, v := range slices.Backward(migrations.Versions()) {
		_, down, err := migrations.SQL(v, byHand)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, down)
		require.NoError(t, err, "migration %d down", v)
	}
	require.Empty(t, describe(t, pool, byHand))

	_, _, err = migrations.SQL(0, "")
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = migrations.SQL(migrations.Latest()+1, "")
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = migrations.SQL(1, "Bad-Schema")
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	up, _, err := migrations.SQL(1, "")
	require.NoError(t, err)
	require.Contains(t, up, `CREATE TABLE "arbor".tasks (`, "the default schema is arbor")
}

func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.arbor_migrations (version, name) VALUES ($1, 'from_the_future')`, migrations.Latest()+1)
	require.NoError(t, err)
	err = migrations.Check(ctx, pool, schema)
	var ve *migrations.VersionError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, migrations.Latest()+1, ve.Have)
	require.Equal(t, migrations.Latest(), ve.Want)
	require.Contains(t, err.Error(), "newer than this build")

	m, err := migrations.New(pool, schema, nil)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrVersionMismatch, "up refuses a schema it does not know")
}

func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	schema := testdb.Name("arbor_mig")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	m, err := migrations.New(pool, schema, nil)
	require.NoError(t, err)
	results := make(chan []int, 2)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			applied, err := m.Up(ctx)
			results <- applied
			errs <- err
		}()
	}
	total := 0
	for range 2 {
		require.NoError(t, <-errs)
		total += len(<-results)
	}
	require.Equal(t, migrations.Latest(), total, "each migration applied exactly once")
}

func TestBadSchemaName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Arbor", "1abc", "a-b", `x"; DROP TABLE y; --`, ""} {
		if name == "" {
			continue // "" means the default
		}
		_, err := migrations.New(nil, name, nil)
		require.Error(t, err, name)
	}
}

// TestErrorsWrapASentinel (issue 24): every error a Migrator returns
// wraps one of arbor's sentinels — a server it cannot reach
// ErrUnavailable, a schema in its way ErrDatabase, a bad target
// ErrInvalidArgument — with the database's error in the chain.
func TestErrorsWrapASentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig("postgres://arbor@/postgres?host=/nonexistent-arbor-dir&sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	unreachable, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(unreachable.Close)
	m, err := migrations.New(unreachable, "arbor_unreachable", nil)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.ErrorIs(t, err, arbortype.ErrUnavailable)
	_, err = m.Down(ctx, 0)
	require.ErrorIs(t, err, arbortype.ErrUnavailable)
	_, err = m.Version(ctx)
	require.ErrorIs(t, err, arbortype.ErrUnavailable)
	_, err = m.Down(ctx, migrations.Latest()+1)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)

	// A table of arbor's name already in the schema: the baseline fails,
	// and nothing of it stays.
	pool := testdb.NewPool(t)
	schema := testdb.Name("arbor_in_the_way")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()+`; CREATE TABLE `+pgx.Identifier{schema, "tasks"}.Sanitize()+` (x int)`)
	require.NoError(t, err)
	m, err = migrations.New(pool, schema, nil)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.ErrorIs(t, err, arbortype.ErrDatabase)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
}

// TestRecordRulesCoverEveryColumn: every column of each table of records
// is under a rule of guardrules.RecordRules (fixed, changed only so, or free with
// why), so a column added without one fails here, not in production.
func TestRecordRulesCoverEveryColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	schema := testdb.Name("arbor_records")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	m, err := migrations.New(pool, schema, nil)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	for _, r := range guardrules.RecordRules() {
		var columns []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
			WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`,
			pgx.Identifier{schema, r.Table}.Sanitize()).Scan(&columns))
		ruled := map[string]bool{}
		for _, c := range append(r.Fixed, r.Free...) {
			ruled[c] = true
		}
		for _, ch := range r.Changes {
			for _, c := range ch.Columns {
				ruled[c] = true
			}
		}
		for _, c := range columns {
			require.True(t, ruled[c], "%s.%s is under no rule of guardrules.RecordRules", r.Table, c)
		}
		for c := range ruled {
			require.Contains(t, columns, c, "guardrules.RecordRules names %s.%s, which the table does not have", r.Table, c)
		}
		// The generated function guards the table: a trigger calls it for
		// updates (and inserts, deletes, as its rules say). The triggers
		// are written by hand in the baseline.
		var ops []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT op ORDER BY op), '{}') FROM pg_trigger tg
			CROSS JOIN LATERAL (VALUES (CASE WHEN tg.tgtype & 4 <> 0 THEN 'INSERT' END), (CASE WHEN tg.tgtype & 16 <> 0 THEN 'UPDATE' END),
				(CASE WHEN tg.tgtype & 8 <> 0 THEN 'DELETE' END)) v(op)
			WHERE tg.tgrelid = $1::regclass AND tg.tgfoid = $2::regprocedure AND op IS NOT NULL`,
			pgx.Identifier{schema, r.Table}.Sanitize(), pgx.Identifier{schema, r.Function}.Sanitize()+"()").Scan(&ops))
		want := []string{"UPDATE"}
		if len(r.Insert) > 0 {
			want = append([]string{"INSERT"}, want...)
		}
		if r.Delete != nil {
			want = append([]string{"DELETE"}, want...)
		}
		require.ElementsMatch(t, want, ops, "%s: the operations %s guards", r.Table, r.Function)
	}
}

// TestVersionErrorSaysWhatToDo: the three ways a schema can miss this
// build's version, each with what the operator does next. (With one
// migration, a schema older than the build but migrated cannot be made by
// the Migrator: the message is checked on the error itself.)
func TestVersionErrorSaysWhatToDo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		have, want int
		says       string
	}{
		{0, 2, `arbor schema "s" is not migrated (version 0; this build needs version 2): run ` + "`arbor migrate up`"},
		{1, 2, `arbor schema "s" is at version 1; this build needs version 2: run ` + "`arbor migrate up`"},
		{3, 2, `arbor schema "s" is at version 3, newer than this build knows (version 2): upgrade arbor`},
	} {
		err := error(&migrations.VersionError{Schema: "s", Have: c.have, Want: c.want})
		require.EqualError(t, err, c.says)
		require.ErrorIs(t, err, migrations.ErrVersionMismatch)
	}
}
