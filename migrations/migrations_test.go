package migrations_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
