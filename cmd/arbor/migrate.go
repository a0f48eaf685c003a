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
  arbor migrate down 1
`

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", migrateHelp, stderr)
	var db dbFlags
	db.register(fs)
	if len(args) == 0 {
		fs.Usage()
		return fmt.Errorf("migrate: say up, down TARGET or version")
	}
	verb, rest := args[0], args[1:]
	target := -1
	if verb == "down" {
		if len(rest) == 0 {
			return fmt.Errorf("migrate down: give the target version (0 removes everything)")
		}
		v, err := strconv.Atoi(rest[0])
		if err != nil {
			return fmt.Errorf("migrate down: target %q is not a number", rest[0])
		}
		target, rest = v, rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, db.schema, nil)
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
	default:
		fs.Usage()
		return fmt.Errorf("migrate: unknown verb %q", verb)
	}
	return nil
}
