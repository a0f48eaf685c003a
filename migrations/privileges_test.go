package migrations_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// privBundle is a schema owned by a migration role that cannot create
// anything in the database, and a runtime role that may only read and
// write the schema's rows once grantRuntime has run: the setup of
// docs/operations.md, "Roles".
type privBundle struct {
	ctx      context.Context
	admin    *pgxpool.Pool
	schema   string
	migrator string
	runtime  string
}

func setupPrivileges(t *testing.T) *privBundle {
	t.Helper()
	ctx := context.Background()
	b := &privBundle{ctx: ctx, admin: testdb.NewPool(t), schema: testdb.Name("arbor_priv"),
		migrator: testdb.Name("arbor_migrator"), runtime: testdb.Name("arbor_runtime")}
	var database string
	require.NoError(t, b.admin.QueryRow(ctx, `SELECT current_database()`).Scan(&database))
	schema, migrator, runtime, db := ident(b.schema), ident(b.migrator), ident(b.runtime), ident(database)

	// Roles belong to the cluster, not to the database or the schema: they
	// outlive the test unless it drops them, after what they own and the
	// privileges granted to them (DROP OWNED revokes those, the database's
	// CONNECT included).
	_, err := b.admin.Exec(ctx, `CREATE ROLE `+migrator+` LOGIN`)
	require.NoError(t, err)
	_, err = b.admin.Exec(ctx, `CREATE ROLE `+runtime+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_, err := b.admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		require.NoError(t, err)
		require.NoError(t, onDatabaseACL(ctx, b.admin, `DROP OWNED BY `+migrator+`, `+runtime))
		_, err = b.admin.Exec(ctx, `DROP ROLE `+migrator+`, `+runtime)
		require.NoError(t, err)
	})

	// The migration role's statements of docs/operations.md, as a
	// superuser runs them.
	_, err = b.admin.Exec(ctx, `CREATE SCHEMA `+schema+` AUTHORIZATION `+migrator)
	require.NoError(t, err)
	for _, sql := range []string{
		`GRANT CONNECT ON DATABASE ` + db + ` TO ` + migrator,
		`GRANT CONNECT ON DATABASE ` + db + ` TO ` + runtime,
	} {
		require.NoError(t, onDatabaseACL(ctx, b.admin, sql), sql)
	}

	var super, createDB bool
	require.NoError(t, b.admin.QueryRow(ctx, `SELECT rolsuper, has_database_privilege($1, current_database(), 'CREATE')
		FROM pg_roles WHERE rolname = $1`, b.migrator).Scan(&super, &createDB))
	require.False(t, super)
	require.False(t, createDB, "the migration role must not be able to create schemas in the database")
	return b
}

// grantRuntime runs the runtime role's statements of docs/operations.md, as
// a superuser runs them: on the tables and sequences that exist, and by
// default on those the migration role creates later.
func (b *privBundle) grantRuntime(t *testing.T) {
	t.Helper()
	schema, migrator, runtime := ident(b.schema), ident(b.migrator), ident(b.runtime)
	for _, sql := range []string{
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + runtime,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + runtime,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA ` + schema + ` TO ` + runtime,
		`ALTER DEFAULT PRIVILEGES FOR ROLE ` + migrator + ` IN SCHEMA ` + schema +
			` GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ` + runtime,
		`ALTER DEFAULT PRIVILEGES FOR ROLE ` + migrator + ` IN SCHEMA ` + schema +
			` GRANT USAGE ON SEQUENCES TO ` + runtime,
	} {
		_, err := b.admin.Exec(b.ctx, sql)
		require.NoError(t, err, sql)
	}
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// onDatabaseACL runs sql, a statement that changes the database's own
// privileges (a GRANT … ON DATABASE, a DROP OWNED that revokes one), one
// at a time across the tests that share the server: two at once update
// the database's catalog row together, and one fails with "tuple
// concurrently updated" (XX000).
func onDatabaseACL(ctx context.Context, admin *pgxpool.Pool, sql string) error {
	tx, err := admin.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('arbor tests: the database''s privileges'))`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// poolAs opens a pool on the test database that logs in as role, closed
// when the test ends.
func poolAs(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestLeastPrivilege migrates as a role that owns its schema but may not
// create anything in the database, and runs the engine and a runner as a
// role with nothing but USAGE on the schema and DML on its tables and
// sequences: arbor must need no more than docs/operations.md grants.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setupPrivileges(t)
	m, err := migrations.New(poolAs(t, b.migrator), b.schema, nil)
	require.NoError(t, err)

	applied, err := m.Up(b.ctx)
	require.NoError(t, err)
	require.Len(t, applied, migrations.Latest())
	// Granted after the tables exist, as in an installation that moves to
	// a runtime role of its own: the grants on every table and sequence
	// cover them.
	b.grantRuntime(t)
	b.requireRuntimeWorks(t)

	// Tables created after the grants (by a later migration; here by the
	// same migrations again) are new objects: the runtime reaches them only
	// through the default privileges.
	_, err = m.Down(b.ctx, 0)
	require.NoError(t, err)
	_, err = m.Up(b.ctx)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(b.ctx, b.admin, b.schema))
	b.requireRuntimeWorks(t)
}

// requireRuntimeWorks runs, as the runtime role, what a service does: a
// runner that claims, sleeps and completes tasks, and a user's creates,
// reads, early wake, cancel and abort.
func (b *privBundle) requireRuntimeWorks(t *testing.T) {
	t.Helper()
	ctx := b.ctx
	logs := &warnLog{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("warnings and errors logged: %q", logs.all())
		}
	})
	pool := poolAs(t, b.runtime)
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: b.schema, Logger: slog.New(logs)})
	require.NoError(t, err)
	conv := testdb.Conversation(t)

	// A runner as the runtime role: leases, claims, the wake jobs of sleeps
	// (River's tables), River's client working the wake queue.
	ran := make(chan string, 10)
	runner, err := machine.NewRunner(engine, map[string]machine.Handler{
		"nap": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "rested" {
				defer func() { ran <- "woke" }()
				return run.Complete(ctx, []byte(`"rested"`))
			}
			return run.SleepUntil(ctx, time.Now().Add(100*time.Millisecond), "rested", nil)
		},
		"hibernate": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "rested" {
				defer func() { ran <- "woken early" }()
				return run.Complete(ctx, nil)
			}
			defer func() { ran <- "hibernating" }()
			return run.SleepUntil(ctx, time.Now().Add(time.Hour), "rested", nil)
		},
	}, &machine.RunnerConfig{})
	require.NoError(t, err)
	require.NoError(t, runner.Start(ctx))
	defer func() { require.NoError(t, runner.Stop(ctx)) }()

	nap, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "nap"})
	require.NoError(t, err)
	require.Equal(t, "woke", next(t, ran))
	nap, err = engine.Get(ctx, nap.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, nap.Status)

	// An early wake and a cancel each delete a sleep's wake job.
	for _, end := range []string{"wake", "cancel"} {
		sleeper, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "hibernate"})
		require.NoError(t, err)
		require.Equal(t, "hibernating", next(t, ran))
		sleeper, err = engine.Get(ctx, sleeper.ID)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusSleeping, sleeper.Status)
		require.NotZero(t, sleeper.WakeJobID)
		if end == "wake" {
			_, err = engine.WakeNow(ctx, sleeper.ID)
			require.NoError(t, err)
			require.Equal(t, "woken early", next(t, ran))
		} else {
			cancelled, err := engine.Cancel(ctx, sleeper.ID, []byte(`"enough"`))
			require.NoError(t, err)
			require.Equal(t, arbortype.StatusCancelled, cancelled.Status)
		}
		var jobs int
		require.NoError(t, b.admin.QueryRow(ctx, `SELECT count(*) FROM `+ident(b.schema)+`.river_job WHERE id = $1`,
			sleeper.WakeJobID).Scan(&jobs))
		require.Zero(t, jobs, "the %s removed the sleep's wake job", end)
	}

	// A tree the runner has no handlers for, aborted by the user.
	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	child, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: turn.ID, Kind: "search"})
	require.NoError(t, err)
	rep, err := engine.Abort(ctx, turn.ID)
	require.NoError(t, err)
	require.Len(t, rep.Settled, 2)
	child, err = engine.Get(ctx, child.ID)
	require.NoError(t, err)
	require.True(t, child.Status.Settled())

	vs, err := engine.Check(ctx, conv)
	require.NoError(t, err)
	require.Empty(t, vs)
	require.NoError(t, runner.Stop(ctx))
	require.Empty(t, logs.denied(), "nothing the runtime role does in the background is refused")

	// And the runtime role can create nothing in the schema.
	_, err = pool.Exec(ctx, `CREATE TABLE `+ident(b.schema)+`.intruder ()`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "insufficient_privilege")

	// Nor migrate it back down: the refusal is arbor's sentinel, the
	// database's error in its chain (issue 24: it came back as a raw 42501).
	rm, err := migrations.New(pool, b.schema, nil)
	require.NoError(t, err)
	_, err = rm.Down(ctx, migrations.Latest()-1)
	require.ErrorIs(t, err, arbortype.ErrPermissionDenied)
	require.ErrorAs(t, err, &pgErr)
	_, err = migrations.New(pool, "Bad-Schema", nil)
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
}

// next returns what a handler reports next, failing the test if none does
// within a generous bound.
func next(t *testing.T, ran <-chan string) string {
	t.Helper()
	select {
	case s := <-ran:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("no handler reported within 30 s")
		return ""
	}
}

// warnLog is a slog handler that keeps the messages of records at warning
// level and above, which is where the runner and River's client report
// failures in the background, with the records' attributes (the error).
// Attributes and groups added to a logger are dropped: they name the
// component, which the message names too.
type warnLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *warnLog) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelWarn }

func (l *warnLog) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		sb.WriteString(" " + a.String())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, sb.String())
	return nil
}

func (l *warnLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *warnLog) WithGroup(string) slog.Handler      { return l }

func (l *warnLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs)
}

// denied returns the messages that report a refused privilege.
func (l *warnLog) denied() []string {
	var out []string
	for _, m := range l.all() {
		if strings.Contains(m, "permission denied") || strings.Contains(m, "42501") {
			out = append(out, m)
		}
	}
	return out
}
