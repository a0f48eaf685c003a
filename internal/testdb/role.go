package testdb

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RoleWith creates a login role of the test's own with role-level settings
// (ALTER ROLE … SET name = value, as a DBA sets statement_timeout on an
// application's role) and returns a pool configuration that logs in as it;
// the role and what was granted to it are dropped when the test ends.
//
// The role is a member of the role admin's connections log in as, the
// owner of every schema the tests create, so it may use them as that role
// does (but it is no superuser). The caller opens the pool (and may set a
// tracer, a context-watcher, ShouldPing first) and closes it.
func RoleWith(tb testing.TB, admin *pgxpool.Pool, settings map[string]string) *pgxpool.Config {
	tb.Helper()
	ctx := context.Background()
	var owner string
	if err := admin.QueryRow(ctx, `SELECT current_user`).Scan(&owner); err != nil {
		tb.Fatalf("read the current user: %v", err)
	}
	name := Name("arbor_role")
	role := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN IN ROLE `+pgx.Identifier{owner}.Sanitize()); err != nil {
		tb.Fatalf("create role %s: %v", name, err)
	}
	tb.Cleanup(func() {
		// After the pool's close (cleanups run last first): a role with
		// sessions cannot be dropped.
		if _, err := admin.Exec(context.Background(), `DROP ROLE `+role); err != nil {
			tb.Errorf("drop role %s: %v", name, err)
		}
	})
	for setting, value := range settings {
		// Neither a name nor a value can be a parameter of ALTER ROLE:
		// both are quoted as they go in.
		if _, err := admin.Exec(ctx, `ALTER ROLE `+role+` SET `+pgx.Identifier{setting}.Sanitize()+` = `+quoteLiteral(value)); err != nil {
			tb.Fatalf("alter role %s set %s: %v", name, setting, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("parse %s: %v", EnvURL, err)
	}
	cfg.ConnConfig.User = name
	return cfg
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
