package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/arborhq/arbor/migrations"
)

const migrateHelp = `Usage: arbor migrate up|down TARGET|version|print [--down] VERSION [flags]

Applies (up) or reverts (down, to the version TARGET; 0 removes every arbor
and River table) arbor's migrations and River's, in the schema given.
print writes the SQL of arbor's migration VERSION (its down with --down)
for the schema given, without connecting to a database, for a team that
runs migrations with its own tool (docs/operations.md); River's tables are
not in it: River's own migrations create them (river migrate-get).

Example:
  arbor migrate up --schema arbor
  arbor migrate version
  arbor migrate down 0
  arbor migrate print 1 --schema arbor > arbor_v1.up.sql
`

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", migrateHelp, stderr)
	var db dbFlags
	db.register(fs)
	down := fs.Bool("down", false, "print: the migration's down SQL instead of its up")
	pos, err := parseArgs(fs, args, 1, 2, "the verb: up, down TARGET, version or print VERSION")
	if err != nil {
		return err
	}
	verb := pos[0]
	target := -1
	switch {
	case verb == "down" && len(pos) < 2:
		return fmt.Errorf("migrate down: give the target version (0 removes everything)")
	case verb == "print" && len(pos) < 2:
		return fmt.Errorf("migrate print: give the version to print (%s)", versionList())
	case verb == "down", verb == "print":
		if target, err = strconv.Atoi(pos[1]); err != nil {
			what := map[string]string{"down": "target", "print": "version"}[verb]
			return fmt.Errorf("migrate %s: %s %q is not a number", verb, what, pos[1])
		}
	case verb != "up" && verb != "version":
		return fmt.Errorf("migrate: unknown verb %q: say up, down TARGET, version or print VERSION", verb)
	case len(pos) > 1:
		return fmt.Errorf("migrate %s: unexpected argument %q", verb, pos[1])
	}
	if *down && verb != "print" {
		return fmt.Errorf("migrate %s: --down is print's flag (arbor migrate print --down VERSION)", verb)
	}
	if verb == "print" {
		up, downSQL, err := migrations.SQL(target, db.schema)
		if err != nil {
			return fmt.Errorf("migrate print: %w", err)
		}
		if *down {
			up = downSQL
		}
		_, err = io.WriteString(stdout, up)
		return err
	}
	pools, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pools.Close()
	// The migrator holds a session advisory lock: not through a pooler.
	m, err := migrations.New(pools.unpooled(), db.schema, nil)
	if err != nil {
		return err
	}
	switch verb {
	case "up":
		applied, err := m.Up(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema %s: applied %v, now at version %d\n", db.schema, applied, migrations.Latest())
	case "down":
		reverted, err := m.Down(ctx, target)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema %s: reverted %v, now at version %d\n", db.schema, reverted, target)
	case "version":
		v, err := m.Version(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema %s: version %d (this build knows up to %d)\n", db.schema, v, migrations.Latest())
	}
	return nil
}

// versionList names the versions this build knows, for an error.
func versionList() string {
	v := migrations.Versions()
	if len(v) == 1 {
		return fmt.Sprintf("this build knows version %d", v[0])
	}
	return fmt.Sprintf("this build knows versions %d to %d", v[0], v[len(v)-1])
}
