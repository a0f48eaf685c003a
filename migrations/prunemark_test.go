package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// TestPruneMarkIsThePrunesAlone (issue 24): the prune's mark is a row of
// prune_marks, which only a role granted INSERT on it can write
// (migrations/sql/019_record_guards.up.sql). A role with DML on every
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

	hand := testdb.Name("arbor_hand")
	var database string
	require.NoError(t, b.admin.QueryRow(b.ctx, `SELECT current_database()`).Scan(&database))
	schema := ident(b.schema)
	_, err = b.admin.Exec(b.ctx, `CREATE ROLE `+ident(hand)+` LOGIN`)
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

	engine, err := tasks.New(b.ctx, poolAs(t, b.runtime), &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	turn, _, err := engine.Create(b.ctx, tasks.CreateParams{ConversationID: conv, Kind: "turn"})
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
