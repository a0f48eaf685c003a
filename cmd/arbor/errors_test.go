package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/migrations"
)

// TestErrorsAreOneLine runs what an operator gets wrong: each must exit
// non-zero with one line that names the problem, never a stack trace or
// the whole usage text.
func TestErrorsAreOneLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	url := testdb.URL(t)
	unreachable := "postgres://arbor@/postgres?host=/nonexistent-arbor-dir&sslmode=disable"
	unmigrated := testdb.Name("arbor_unmigrated") // never created

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"unknown command", nil, []string{"frobnicate"}, 1, `unknown command "frobnicate"`},
		{"help for unknown command", nil, []string{"help", "frobnicate"}, 1, `help: unknown command "frobnicate"`},
		{"unknown task", nil, []string{"show", "999999", "--database-url", url, "--schema", b.schema}, 1, "task 999999 not found"},
		{"abort unknown task", nil, []string{"abort", "999999", "--database-url", url, "--schema", b.schema}, 1, "task 999999 not found"},
		{"cancel unknown task", nil, []string{"cancel", "999999", "--database-url", url, "--schema", b.schema}, 1, "task 999999 not found"},
		{"wake unknown task", nil, []string{"wake", "999999", "--database-url", url, "--schema", b.schema}, 1, "task 999999 not found"},
		{"not a task id", nil, []string{"show", "abc"}, 1, `"abc" is not a task id`},
		{"zero task id", nil, []string{"abort", "0"}, 1, `"0" is not a task id`},
		{"missing task id", nil, []string{"show"}, 1, "show: missing the task id"},
		{"extra argument", nil, []string{"tree", "a", "b"}, 1, `tree: unexpected argument "b"`},
		{"unknown conversation", nil, []string{"tree", "nope", "--database-url", url, "--schema", b.schema}, 1, `conversation "nope" not found`},
		{"no database", nil, []string{"tree", b.conv}, 1, "no database: pass --database-url or set ARBOR_DATABASE_URL"},
		{"no database, ls", nil, []string{"ls"}, 1, "no database"},
		{"empty env", []string{"ARBOR_DATABASE_URL="}, []string{"show", "1"}, 1, "no database"},
		{"unreachable", nil, []string{"show", "1", "--database-url", unreachable}, 1, "cannot reach the database"},
		{"bad URL", nil, []string{"ls", "--database-url", "postgres://%zz"}, 1, "database URL"},
		{"unmigrated schema", nil, []string{"tree", b.conv, "--database-url", url, "--schema", unmigrated}, 1,
			`arbor schema "` + unmigrated + `" is not migrated (version 0; this build needs version ` + fmt.Sprint(migrations.Latest()) + `): run ` + "`arbor migrate up`"},
		{"bad schema name", nil, []string{"ls", "--database-url", url, "--schema", "Bad-Name"}, 1, `schema "Bad-Name": must be a lower-case identifier`},
		{"watch interval", nil, []string{"tree", b.conv, "--watch", "--interval", "1ms"}, 1, "--interval 1ms is below 10ms"},
		{"migrate without verb", nil, []string{"migrate"}, 1, "migrate: missing the verb"},
		{"migrate unknown verb", nil, []string{"migrate", "sideways"}, 1, `migrate: unknown verb "sideways"`},
		{"migrate down without target", nil, []string{"migrate", "down", "--database-url", url, "--schema", b.schema}, 1, "migrate down: give the target version"},
		{"migrate down bad target", nil, []string{"migrate", "down", "x"}, 1, `target "x" is not a number`},
		// Issue 24: each of these panicked, followed forever or said what
		// it had "deleted".
		{"emit with an empty token", nil, []string{"emit", "--token", "", "--database-url", url, "--schema", b.schema}, 1, "emit: --token is empty"},
		{"log until a negative task", nil, []string{"log", b.conv, "--follow", "--until-settled", "-1", "--database-url", url, "--schema", b.schema}, 1,
			"--until-settled -1: a task id is positive"},
		{"log until an unknown task", nil, []string{"log", b.conv, "--follow", "--until-settled", "999999", "--database-url", url, "--schema", b.schema}, 1,
			"--until-settled 999999: no such task in conversation"},
		{"log until without follow", nil, []string{"log", b.conv, "--until-settled", "1", "--database-url", url, "--schema", b.schema}, 1,
			"--until-settled goes with --follow"},
		{"prune dry run with a bad batch", nil, []string{"prune", "--older-than", "1h", "--dry-run", "--batch", "1000000000", "--database-url", url, "--schema", b.schema}, 1,
			"(nothing was deleted)"},
		// A flag's mistake is one line too, not the whole usage.
		{"unknown flag", nil, []string{"events", b.conv, "--limit", "5"}, 1, "events: flag provided but not defined: -limit (see arbor events --help)"},
		{"a flag's value that does not parse", nil, []string{"emit", "--task", "abc", b.conv, "x"}, 1, `emit: invalid value "abc" for flag -task`},
		{"a duration that does not parse", nil, []string{"prune", "--older-than", "soon"}, 1, `prune: invalid value "soon" for flag -older-than`},
		{"a boolean that does not parse", nil, []string{"show", "1", "--json=maybe"}, 1, `show: invalid boolean value "maybe" for -json`},
		{"a flag without its value", nil, []string{"ls", "--limit"}, 1, "ls: flag needs an argument: -limit"},
		{"an emit of arbor's own event", nil, []string{"emit", b.conv, "arbor:budget", "--database-url", url, "--schema", b.schema}, 1,
			`the prefix "arbor:" is arbor's own`},
		{"a budget of a bad counter", nil, []string{"budget", b.conv, "Bad Counter", "5", "--database-url", url, "--schema", b.schema}, 1,
			`counter "Bad Counter"`},
		{"a negative budget", nil, []string{"budget", b.conv, "tokens", "-5", "--database-url", url, "--schema", b.schema}, 1,
			`maximum "-5" is not a count`},
		{"a cancel's result that is not JSON", nil, []string{"cancel", "1", "--result", "{nope", "--database-url", url, "--schema", b.schema}, 1,
			"--result is not valid JSON"},
		{"a fork of a turn that is not one", nil, []string{"fork", b.conv, "999999", "--database-url", url, "--schema", b.schema}, 1, "not found"},
		{"a listen address that is not one", nil, []string{"ui", "--addr", "bad:addr:x", "--database-url", url, "--schema", b.schema}, 1, "too many colons"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runArbor(t, tc.env, tc.args...)
			r.fails(t, tc.code, tc.want)
			require.Empty(t, r.stdout)
			require.NotContains(t, r.stderr, "goroutine")
		})
	}
	// None of it changed anything.
	b.requireInvariants(t)
	require.Equal(t, "waiting", string(b.get(t, 1).Status))
}

// TestNegativeTaskIDs: an argument that is a negative number is a
// positional argument, not a flag, so that a task id of -1 or 0 gets the
// same one line as any other bad id, wherever the flags stand, and never
// the usage; a flag's value may still be negative.
func TestNegativeTaskIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	db := []string{"--database-url", testdb.URL(t), "--schema", b.schema}
	for _, cmd := range []string{"show", "abort", "cancel", "wake"} {
		for _, args := range [][]string{{"-1"}, {"-0"}, {"0"}, {"-42"}, {"-9223372036854775808"}, {"--", "-1"}} {
			t.Run(cmd+" "+strings.Join(args, " "), func(t *testing.T) {
				t.Parallel()
				want := fmt.Sprintf("arbor: %q is not a task id (a positive number, such as 42)", args[len(args)-1])
				// Alone, and with the database flags before it and (but
				// for "--") after it.
				runs := [][]string{
					append([]string{cmd}, args...),
					append(append([]string{cmd}, db...), args...),
				}
				if args[0] != "--" {
					runs = append(runs, append(append([]string{cmd}, args...), db...))
				}
				for _, run := range runs {
					r := runArbor(t, nil, run...)
					r.fails(t, 1, want)
					require.Empty(t, r.stdout)
				}
			})
		}
	}
	// A boolean flag before it does not take it as its value.
	runArbor(t, nil, "show", "--json", "-1").fails(t, 1, `"-1" is not a task id`)
	// A flag that takes a value still takes a negative one.
	b.arbor(t, "ls", "--limit", "-1").fails(t, 1, "ls: --limit -1 is negative")
	runArbor(t, nil, "cancel", "--result", "-1", "-2").fails(t, 1, `"-2" is not a task id`)
	// Where a conversation or a version is expected, -1 is one too.
	b.arbor(t, "tree", "-1").fails(t, 1, `conversation "-1" not found`)
	b.arbor(t, "check", "-1").fails(t, 2, `conversation "-1" not found`)
	b.arbor(t, "migrate", "down", "-1").fails(t, 1, "target -1 is outside")
	// Nothing changed.
	b.requireInvariants(t)
	require.Equal(t, "waiting", string(b.get(t, 1).Status))
}

// TestUsageErrors: a flag arbor does not know is one line, as every
// input error (issue 24: the flag package printed the whole usage before
// it); a bare arbor prints the usage, and the last line is arbor's, naming
// what is wrong.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	runArbor(t, nil, "tree", "c", "--frob").fails(t, 1, "arbor: tree: flag provided but not defined: -frob (see arbor tree --help)")

	// No command at all: the usage, then the line saying what is missing.
	r := runArbor(t, nil)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "arbor tree CONVERSATION")
	require.True(t, strings.HasSuffix(r.stderr, "\narbor: no command given\n"), r.stderr)
}

// TestHelp: every command has --help with an example, exits 0, and needs
// no database.
func TestHelp(t *testing.T) {
	t.Parallel()
	for name := range commands {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
				r := runArbor(t, nil, args...)
				require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
				require.Contains(t, r.stderr, "Usage: arbor "+name)
				require.Contains(t, r.stderr, "Example:")
				require.Contains(t, r.stderr, "-database-url")
			}
		})
	}
	r := runArbor(t, nil, "help").ok(t)
	for name := range commands {
		require.Contains(t, r.stdout, "\n  arbor "+name+" ")
	}
}

// TestDatabaseURLFromEnvironment: without --database-url the command reads
// ARBOR_DATABASE_URL.
func TestDatabaseURLFromEnvironment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	r := runArbor(t, []string{"ARBOR_DATABASE_URL=" + testdb.URL(t)}, "tree", b.conv, "--schema", b.schema, "--no-age").ok(t)
	require.Contains(t, r.stdout, "#1 chat_turn [waiting]")
}

// TestMigrate takes a schema from nothing to the latest version and back,
// and shows that tree refuses it while it is not migrated.
func TestMigrate(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	schema := testdb.Name("arbor_cli_migrate")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	url := testdb.URL(t)
	db := []string{"--database-url", url, "--schema", schema}
	run := func(args ...string) result { return runArbor(t, nil, append(args, db...)...) }

	latest := migrations.Latest()
	all := make([]int, latest)
	for i := range all {
		all[i] = i + 1
	}
	require.Equal(t, fmt.Sprintf("schema %s: version 0 (this build knows up to %d)\n", schema, latest), run("migrate", "version").ok(t).stdout)
	run("ls").fails(t, 1, "is not migrated")
	require.Equal(t, fmt.Sprintf("schema %s: applied %v, now at version %d\n", schema, all, latest), run("migrate", "up").ok(t).stdout)
	require.Equal(t, fmt.Sprintf("schema %s: applied [], now at version %d\n", schema, latest), run("migrate", "up").ok(t).stdout)
	require.Equal(t, "no conversation has live work\n", run("ls").ok(t).stdout)
	require.Equal(t, "schema "+schema+": reverted "+fmt.Sprint(reversedInts(all))+", now at version 0\n", run("migrate", "down", "0").ok(t).stdout)
	run("ls").fails(t, 1, "is not migrated")
	require.Equal(t, "schema "+schema+": reverted [], now at version 0\n", run("migrate", "down", "0").ok(t).stdout)
	run("migrate", "down", "99").fails(t, 1, fmt.Sprintf("target 99 is outside 0..%d", latest))
	require.Equal(t, fmt.Sprintf("schema %s: applied %v, now at version %d\n", schema, all, latest), run("migrate", "up").ok(t).stdout)
	require.Equal(t, "no conversation has live work\n", run("ls").ok(t).stdout)
}

// TestMigratePrint: print writes the SQL of a migration for the schema
// given, as package migrations exports it, without a database; bad
// versions, schemas and flags are one line on stderr.
func TestMigratePrint(t *testing.T) {
	t.Parallel()
	for _, v := range migrations.Versions() {
		up, down, err := migrations.SQL(v, "app")
		require.NoError(t, err)
		require.Equal(t, up, runArbor(t, nil, "migrate", "print", fmt.Sprint(v), "--schema", "app").ok(t).stdout)
		require.Equal(t, down, runArbor(t, nil, "migrate", "print", "--down", fmt.Sprint(v), "--schema", "app").ok(t).stdout)
	}
	baseline := runArbor(t, nil, "migrate", "print", "1").ok(t).stdout
	require.Contains(t, baseline, `CREATE TABLE "arbor".tasks (`)
	require.Contains(t, baseline, `FUNCTION "arbor".task_guard() RETURNS trigger`)
	require.NotContains(t, baseline, "{schema}")

	runArbor(t, nil, "migrate", "print").fails(t, 1, "give the version to print")
	runArbor(t, nil, "migrate", "print", "x").fails(t, 1, `version "x" is not a number`)
	runArbor(t, nil, "migrate", "print", fmt.Sprint(migrations.Latest()+1)).fails(t, 1, "is outside 1..")
	runArbor(t, nil, "migrate", "print", "1", "--schema", "Bad").fails(t, 1, "must be a lower-case identifier")
	runArbor(t, nil, "migrate", "up", "--down").fails(t, 1, "--down is print's flag")
}

func reversedInts(v []int) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[len(v)-1-i] = x
	}
	return out
}
