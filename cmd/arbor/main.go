// Command arbor migrates, inspects and steers arbor's task trees from a
// terminal, and runs the demo.
//
//	arbor migrate up|down|version
//	arbor demo
//
// The database URL comes from --database-url or ARBOR_DATABASE_URL, the
// schema from --schema (default "arbor").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "arbor:", err)
		}
		os.Exit(1)
	}
}

const usage = `arbor keeps the task trees of conversations in PostgreSQL.

Usage:
  arbor migrate up|down|version   apply or revert arbor's (and River's) migrations
  arbor demo                      run the end-to-end demo

Every command takes --database-url (default $ARBOR_DATABASE_URL) and
--schema (default "arbor"). Run "arbor COMMAND --help" for its flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "migrate":
		return cmdMigrate(ctx, args[1:], stdout, stderr)
	case "demo":
		return cmdDemo(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
