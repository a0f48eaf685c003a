package migrations_test

import (
	"context"
	"fmt"
	"os"
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
	require.Len(t, applied, migrations.Latest())
	require.NoError(t, migrations.Check(ctx, pool, schema))
	require.True(t, tableExists(t, pool, schema, "tasks"))
	require.True(t, tableExists(t, pool, schema, "river_job"), "River's tables are migrated alongside")

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "re-running up is a no-op")

	reverted, err := m.Down(ctx, 1)
	require.NoError(t, err)
	var above1 []int
	for v := migrations.Latest(); v > 1; v-- {
		above1 = append(above1, v)
	}
	require.Equal(t, above1, reverted, "down reverts every version above the target, newest first")
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, v)
	err = migrations.Check(ctx, pool, schema)
	require.ErrorIs(t, err, migrations.ErrVersionMismatch)
	require.Contains(t, err.Error(), "version 1")
	require.Contains(t, err.Error(), fmt.Sprintf("version %d", migrations.Latest()))

	_, err = m.Down(ctx, 0)
	require.NoError(t, err)
	require.False(t, tableExists(t, pool, schema, "tasks"))
	require.False(t, tableExists(t, pool, schema, "river_job"))
	v, err = m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, v)

	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, schema))
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

// TestLogErrorMessageUpDown: 014_log_error_message puts a settle's error
// message in its log entry beside the code, and its down restores 007's
// function exactly (an entry with the code only); up again brings the
// message back. The settles are written by hand: the engine refuses a
// schema at version 13.
func TestLogErrorMessageUpDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Fresh(t)
	m, err := migrations.New(pool, schema, nil)
	require.NoError(t, err)
	q := func(sql string) string { return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize()) }
	settle := func(conv string) map[string]any {
		t.Helper()
		var payload map[string]any
		err := pool.QueryRow(ctx, q(`WITH c AS (INSERT INTO {schema}.conversations (id) VALUES ($1) RETURNING id),
			t AS (INSERT INTO {schema}.tasks (conversation_id, kind) SELECT id, 'turn' FROM c RETURNING id)
			SELECT id FROM t`), conv).Scan(new(int64))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, q(`UPDATE {schema}.tasks SET status = 'cancelled', error = '{"code": "stopped", "message": "the user pressed stop"}',
			settle_seq = nextval('{schema}.task_settle_seq'), settled_at = now(), updated_at = now() WHERE conversation_id = $1`), conv)
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, q(`SELECT payload FROM {schema}.conversation_log
			WHERE conversation_id = $1 AND status = 'cancelled'`), conv).Scan(&payload))
		return payload
	}
	function := func() string {
		var def string
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_functiondef(to_regproc($1))`, schema+".log_task_update").Scan(&def))
		return def
	}

	// The log's trigger is gone since 024 (the statements that change a
	// status log it themselves): 014 is looked at from 023 down.
	_, err = m.Down(ctx, 23)
	require.NoError(t, err)
	at23 := function()
	require.Equal(t, map[string]any{"error": "stopped", "message": "the user pressed stop"}, settle("at-14"))
	_, err = m.Down(ctx, 13)
	require.NoError(t, err)
	require.Equal(t, map[string]any{"error": "stopped"}, settle("at-13"), "007's entry: the code only")
	require.NotEqual(t, at23, function())
	_, err = m.Up(ctx)
	require.NoError(t, err)
	_, err = m.Down(ctx, 23)
	require.NoError(t, err)
	require.Equal(t, at23, function(), "024's down restores the trigger 023 had")
	require.Equal(t, map[string]any{"error": "stopped", "message": "the user pressed stop"}, settle("at-14-again"))
	_, err = m.Up(ctx)
	require.NoError(t, err)
}

// TestDownRestoresTheFunctionItReplaced: a down file that replaces a
// function restores the body of the migration it replaced: 014's down is
// 007's log_task_update, character for character.
func TestDownRestoresTheFunctionItReplaced(t *testing.T) {
	t.Parallel()
	body := func(file string) string {
		t.Helper()
		b, err := os.ReadFile("sql/" + file)
		require.NoError(t, err)
		s := string(b)
		i := strings.Index(s, "{schema}.log_task_update() RETURNS trigger")
		require.GreaterOrEqual(t, i, 0, file)
		j := strings.Index(s[i:], "END $$;")
		require.GreaterOrEqual(t, j, 0, file)
		return s[i : i+j]
	}
	require.Equal(t, body("007_events_log.up.sql"), body("014_log_error_message.down.sql"))
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

	// A table of arbor's name already in the schema: migration 001 fails,
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
		// are the migrations' (019, 021, 023).
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
