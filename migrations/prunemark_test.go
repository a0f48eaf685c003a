package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// TestPruneMarkIsThePrunesAlone (issue 24): the prune's mark is a row of
// prune_marks, which only a role granted INSERT on it can write
// (the baseline, migrations/sql/001_baseline.up.sql). A role with DML on every
// other table of arbor's cannot mark its transaction: arbor.prune, the
// setting that used to be the mark and that any role can set, is nothing
// to the guards now, an INSERT into prune_marks is refused (42501), and
// its deletes of a settled turn, of its conversation and of its log
// entries are refused (AB006). The runtime role, granted on all tables as
// docs/operations.md says, prunes them.
func TestPruneMarkIsThePrunesAlone(t *testing.T) {
	t.Parallel()
	b := setupPrivileges(t)
	m, err := migrations.New(poolAs(t, b.migrator), b.schema, nil)
	require.NoError(t, err)
	_, err = m.Up(b.ctx)
	require.NoError(t, err)
	b.grantRuntime(t)

	hand := b.handRole(t)
	schema := ident(b.schema)

	engine, err := tasks.New(b.ctx, poolAs(t, b.runtime), &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	turn, _, err := engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = engine.Cancel(b.ctx, turn.ID, nil)
	require.NoError(t, err)

	handPool := poolAs(t, hand)
	forged := []struct{ name, sql, code string }{
		{"the turn", `DELETE FROM ` + schema + `.tasks WHERE conversation_id = $1`, "AB006"},
		{"the conversation's log", `DELETE FROM ` + schema + `.conversation_log WHERE conversation_id = $1`, "AB006"},
		{"the conversation", `DELETE FROM ` + schema + `.conversations WHERE id = $1`, "AB006"},
		{"a mark", `INSERT INTO ` + schema + `.prune_marks SELECT WHERE $1::text IS NOT NULL`, "42501"},
	}
	for _, f := range forged {
		err := pgx.BeginFunc(b.ctx, handPool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `SET LOCAL arbor.prune = 'on'`); err != nil {
				return err
			}
			var marked bool
			if err := tx.QueryRow(b.ctx, `SELECT `+schema+`.prune_marked()`).Scan(&marked); err != nil {
				return err
			}
			require.False(t, marked, f.name)
			_, err := tx.Exec(b.ctx, f.sql, conv)
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, f.name)
		require.Equal(t, f.code, pgErr.Code, "%s: %s", f.name, pgErr.Message)
	}
	tree, err := engine.ConversationTasks(b.ctx, conv)
	require.NoError(t, err)
	require.Len(t, tree, 1, "nothing deleted")

	res, err := engine.Prune(b.ctx, tasks.PruneParams{OlderThan: time.Nanosecond})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Tasks)
	require.EqualValues(t, 1, res.Conversations)
	var marks int
	require.NoError(t, b.admin.QueryRow(b.ctx, `SELECT count(*) FROM `+schema+`.prune_marks`).Scan(&marks))
	require.Zero(t, marks, "every batch removed its mark")
}

// handRole creates a role granted DML on every table of arbor's but
// prune_marks (a service or a person with a SQL console, as
// docs/operations.md, "Retention", advises), dropped when the test ends.
func (b *privBundle) handRole(t *testing.T) string {
	t.Helper()
	hand := testdb.Name("arbor_hand")
	var database string
	require.NoError(t, b.admin.QueryRow(b.ctx, `SELECT current_database()`).Scan(&database))
	schema := ident(b.schema)
	_, err := b.admin.Exec(b.ctx, `CREATE ROLE `+ident(hand)+` LOGIN`)
	require.NoError(t, err)
	require.NoError(t, onDatabaseACL(b.ctx, b.admin, `GRANT CONNECT ON DATABASE `+ident(database)+` TO `+ident(hand)))
	for _, sql := range []string{
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + ident(hand),
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + schema + `.tasks, ` + schema + `.conversations, ` + schema + `.events, ` +
			schema + `.conversation_log, ` + schema + `.budgets, ` + schema + `.budget_reservations TO ` + ident(hand),
	} {
		_, err := b.admin.Exec(b.ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		require.NoError(t, onDatabaseACL(ctx, b.admin, `DROP OWNED BY `+ident(hand)))
		_, err := b.admin.Exec(ctx, `DROP ROLE `+ident(hand))
		require.NoError(t, err)
	})
	return hand
}

// TestPruneMarkNamesItsOwnTransaction (issue 38, G5): a mark names the
// transaction that inserts it, and nothing else. The runtime role may
// insert into prune_marks (it runs the prune); it inserted marks for
// transaction ids not given out yet, and the next transactions, of a role
// granted nothing on prune_marks, were marked and deleted a settled turn.
// Such a mark is refused (AB009), as is a mark of an ended transaction
// and any change of a mark, whoever writes them; the role without the
// grant stays unmarked and its delete refused (AB006); the runtime role's
// prune goes on.
func TestPruneMarkNamesItsOwnTransaction(t *testing.T) {
	t.Parallel()
	b := setupPrivileges(t)
	m, err := migrations.New(poolAs(t, b.migrator), b.schema, nil)
	require.NoError(t, err)
	_, err = m.Up(b.ctx)
	require.NoError(t, err)
	b.grantRuntime(t)
	hand := b.handRole(t)
	schema := ident(b.schema)

	runtimePool := poolAs(t, b.runtime)
	engine, err := tasks.New(b.ctx, runtimePool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	turn, _, err := engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = engine.Cancel(b.ctx, turn.ID, nil)
	require.NoError(t, err)

	forged := []struct{ name, sql string }{
		// The next 100,000 transaction ids: the role's next transaction
		// is among them whatever the other tests do meanwhile.
		{"marks of transactions not begun", `INSERT INTO ` + schema + `.prune_marks
			SELECT (pg_current_xact_id()::text::bigint + g)::text::xid8 FROM generate_series(1, 100000) g`},
		{"a mark of an ended transaction", `INSERT INTO ` + schema + `.prune_marks VALUES ((pg_current_xact_id()::text::bigint - 1)::text::xid8)`},
		// Its own mark (as the prune inserts it), then moved on.
		{"its own mark moved to the next transaction", `INSERT INTO ` + schema + `.prune_marks DEFAULT VALUES`},
	}
	for i, f := range forged {
		err := pgx.BeginFunc(b.ctx, runtimePool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, f.sql); err != nil || i < 2 {
				return err
			}
			_, err := tx.Exec(b.ctx, `UPDATE `+schema+`.prune_marks SET txid = (txid::text::bigint + 1)::text::xid8
				WHERE txid = pg_current_xact_id()`)
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, f.name)
		require.Equal(t, "AB009", pgErr.Code, "%s: %s", f.name, pgErr.Message)
	}
	var marks int
	require.NoError(t, b.admin.QueryRow(b.ctx, `SELECT count(*) FROM `+schema+`.prune_marks`).Scan(&marks))
	require.Zero(t, marks, "no mark written")

	// The role without the grant: its transactions are not marked, and
	// its deletes are refused.
	handPool := poolAs(t, hand)
	for range 3 {
		err := pgx.BeginFunc(b.ctx, handPool, func(tx pgx.Tx) error {
			var marked bool
			if err := tx.QueryRow(b.ctx, `SELECT pg_current_xact_id() IS NOT NULL AND `+schema+`.prune_marked()`).Scan(&marked); err != nil {
				return err
			}
			require.False(t, marked, "a transaction of the role without the grant is not marked")
			_, err := tx.Exec(b.ctx, `DELETE FROM `+schema+`.tasks WHERE conversation_id = $1`, conv)
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "AB006", pgErr.Code, pgErr.Message)
	}
	tree, err := engine.ConversationTasks(b.ctx, conv)
	require.NoError(t, err)
	require.Len(t, tree, 1, "nothing deleted")

	// The prune marks its own transaction, and prunes.
	res, err := engine.Prune(b.ctx, tasks.PruneParams{OlderThan: time.Nanosecond})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Tasks)
	require.EqualValues(t, 1, res.Conversations)
}
