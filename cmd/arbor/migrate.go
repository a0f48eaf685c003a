package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/arborhq/arbor/migrations"
)

const migrateHelp = `Usage: arbor migrate up|down TARGET|version [flags]

Applies (up) or reverts (down, to the version TARGET; 0 removes every arbor
and River table) arbor's migrations and River's, in the schema given.

Example:
  arbor migrate up --schema arbor
  arbor migrate version
  arbor migrate down 1
`

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", migrateHelp, stderr)
	var db dbFlags
	db.register(fs)
	pos, err := parseArgs(fs, args, 1, 2, "the verb: up, down TARGET or version")
	if err != nil {
		return err
	}
	verb := pos[0]
	target := -1
	switch {
	case verb == "down" && len(pos) < 2:
		return fmt.Errorf("migrate down: give the target version (0 removes everything)")
	case verb == "down":
		if target, err = strconv.Atoi(pos[1]); err != nil {
			return fmt.Errorf("migrate down: target %q is not a number", pos[1])
		}
	case verb != "up" && verb != "version":
		return fmt.Errorf("migrate: unknown verb %q: say up, down TARGET or version", verb)
	case len(pos) > 1:
		return fmt.Errorf("migrate %s: unexpected argument %q", verb, pos[1])
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
